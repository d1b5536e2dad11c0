"""``acl.rt``: devices, contexts, streams, events, memory, copies and callbacks, as pyACL has them.

Everything goes through ``rt``'s public API; what differs is pyACL's surface (``acl/_core.py``: codes and
``(value, ret)`` tuples, int handles) and CANN's leniencies: ``memcpy``'s kind is advisory (the addresses
decide; a wrong kind warns once, ``NPUSIM_ACL_STRICT=1`` refuses it), ``memset`` works on host memory too,
``synchronize_device`` takes extra arguments. Callbacks follow pyACL's subscription model: a thread the
program owns subscribes to a stream and runs that stream's callbacks when it calls ``process_report``.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

import rt
from rt import args
from rt.addresses import decode_addr
from rt.config import load_config
from rt.constants import AclErrorCode as E
from rt.constants import EventRecordedStatus, MemAttr, MemcpyKind, MemMallocPolicy, RunMode
from rt.errors import AclError
from rt.host.copies import KIND_OF_SIDES, given_kind, kind_fits
from rt.host.runtime import RUNTIME, parse_visible

from ._callbacks import launch_callback, process_report, subscribe_report, unsubscribe_report
from ._core import CONTEXT, EVENT, HANDLES, STREAM, code, context_of, event_of, stream_of, strict, values
from ._hostptr import REGIONS


# ============================================================================ devices
@values("rt.get_device_count", 0)
def get_device_count():
    """Visible cards; answered from the config (never starting anything) before ``acl.init`` — what Ray's
    NPU detection calls while Ray starts."""
    if RUNTIME.initialized:
        return rt.get_device_count()
    cfg = load_config(None)
    return len(parse_visible(os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), cfg.cards_per_node))


@code("rt.set_device")
def set_device(device_id):
    rt.set_device(device_id)


@code("rt.reset_device")
def reset_device(device_id):
    rt.reset_device(device_id)


@code("rt.reset_device_force")
def reset_device_force(device_id):
    rt.reset_device_force(device_id)


@values("rt.get_device", -1)
def get_device():
    return rt.get_device()


@values("rt.get_run_mode", int(RunMode.ACL_HOST))
def get_run_mode():
    """Always ``ACL_HOST``: the program runs on the host and copies to the cards (acllite relies on it)."""
    return int(RunMode.ACL_HOST)


@code("rt.synchronize_device")
def synchronize_device(*_ignored):
    """Programs pass the device id; CANN ignores it, so does this."""
    rt.synchronize_device()


@values("rt.get_mem_info", 0, 0)
def get_mem_info(attr):
    """``(free, total, ret)``; DDR attributes report the card's memory as well (one kind of memory here)."""
    if not args.is_int(attr) or int(attr) not in MemAttr._value2member_map_:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"rt.get_mem_info: unknown memory attribute {args.shown(attr)}")
    return rt.get_mem_info(rt.HBM)


@values("rt.device_can_access_peer", 0)
def device_can_access_peer(device_id, peer_device_id):
    return int(rt.device_can_access_peer(device_id, peer_device_id))


@code("rt.device_enable_peer_access")
def device_enable_peer_access(peer_device_id, flags=0):
    rt.device_enable_peer_access(peer_device_id, flags)


@code("rt.device_disable_peer_access")
def device_disable_peer_access(peer_device_id):
    RUNTIME.physical(peer_device_id)


# ============================================================================ contexts
@values("rt.create_context", 0)
def create_context(device_id):
    return HANDLES.add(CONTEXT, rt.create_context(device_id))


@code("rt.destroy_context")
def destroy_context(context):
    rt.destroy_context(context_of(context, "rt.destroy_context"))
    HANDLES.drop(context)


@code("rt.set_context")
def set_context(context):
    rt.set_context(context_of(context, "rt.set_context"))


@values("rt.get_context", 0)
def get_context():
    return HANDLES.add(CONTEXT, rt.get_context())


# ============================================================================ streams and events
@values("rt.create_stream", 0)
def create_stream():
    return HANDLES.add(STREAM, rt.create_stream())


UINT32_MAX = (1 << 32) - 1


@values("rt.create_stream_with_config", 0)
def create_stream_with_config(priority=0, flag=0):
    """Priority and flags (C uint32_t) are checked, and have no effect on a simulated card."""
    args.integer(priority, "rt.create_stream_with_config", "priority", hi=UINT32_MAX)
    args.integer(flag, "rt.create_stream_with_config", "flag", hi=UINT32_MAX)
    return HANDLES.add(STREAM, rt.create_stream())


@code("rt.destroy_stream")
def destroy_stream(stream):
    rt.destroy_stream(stream_of(stream, "rt.destroy_stream"))
    HANDLES.drop(stream)


destroy_stream_force = destroy_stream


@code("rt.synchronize_stream")
def synchronize_stream(stream):
    rt.synchronize_stream(stream_of(stream, "rt.synchronize_stream"))


@code("rt.synchronize_stream_with_timeout")
def synchronize_stream_with_timeout(stream, timeout):
    rt.synchronize_stream_with_timeout(stream_of(stream, "rt.synchronize_stream_with_timeout"), timeout)


@values("rt.stream_query", 0)
def stream_query(stream):
    return rt.stream_query(stream_of(stream, "rt.stream_query"))


@code("rt.stream_wait_event")
def stream_wait_event(stream, event):
    rt.stream_wait_event(stream_of(stream, "rt.stream_wait_event"), event_of(event, "rt.stream_wait_event"))


@values("rt.ctx_get_current_default_stream", 0)
def ctx_get_current_default_stream():
    RUNTIME.require_current("rt.ctx_get_current_default_stream")
    return 0


@values("rt.create_event", 0)
def create_event():
    return HANDLES.add(EVENT, rt.create_event())


@values("rt.create_event_with_flag", 0)
def create_event_with_flag(flag):
    """The flag (a C uint32_t: ACL_EVENT_SYNC, ACL_EVENT_TIME_LINE ...) is checked; every event is timed."""
    args.integer(flag, "rt.create_event_with_flag", "flag", hi=UINT32_MAX)
    return HANDLES.add(EVENT, rt.create_event())


create_event_ex_with_flag = create_event_with_flag


@code("rt.destroy_event")
def destroy_event(event):
    rt.destroy_event(event_of(event, "rt.destroy_event"))
    HANDLES.drop(event)


@code("rt.record_event")
def record_event(event, stream):
    rt.record_event(event_of(event, "rt.record_event"), stream_of(stream, "rt.record_event"))


@code("rt.reset_event")
def reset_event(event, stream):
    rt.reset_event(event_of(event, "rt.reset_event"), stream_of(stream, "rt.reset_event"))


@values("rt.query_event_status", 0)
def query_event_status(event):
    """aclrtEventRecordedStatus: NOT_READY = 0, COMPLETE = 1."""
    return rt.query_event_status(event_of(event, "rt.query_event_status"))


@values("rt.query_event", 1)
def query_event(event):
    """The deprecated aclrtEventStatus, numbered the other way round: COMPLETE = 0, NOT_READY = 1."""
    done = rt.query_event_status(event_of(event, "rt.query_event")) == EventRecordedStatus.ACL_EVENT_RECORDED_STATUS_COMPLETE
    return 0 if done else 1


@code("rt.synchronize_event")
def synchronize_event(event):
    rt.synchronize_event(event_of(event, "rt.synchronize_event"))


@values("rt.event_elapsed_time", 0.0)
def event_elapsed_time(start, end):
    return rt.event_elapsed_time(event_of(start, "rt.event_elapsed_time"), event_of(end, "rt.event_elapsed_time"))


# ============================================================================ memory
def _policy(policy, call: str) -> int:
    """aclrtMemMallocPolicy: a value CANN does not know gets its default flags (aclMallocMemInner), not an error."""
    policy = args.integer(policy, call, "policy", hi=(1 << 32) - 1)
    return policy if policy in MemMallocPolicy._value2member_map_ else 0


@values("rt.malloc", 0)
def malloc(size, policy=0):
    return rt.malloc(size, _policy(policy, "rt.malloc"))


malloc_cached = malloc


@values("rt.malloc_align32", 0)
def malloc_align32(size, policy=0):
    return rt.malloc(size, _policy(policy, "rt.malloc_align32"))


def _not_null(ptr, call: str, arg: str) -> None:
    """CANN checks a pointer argument first (ACL_REQUIRES_NOT_NULL): a null one is ACL_ERROR_INVALID_PARAM."""
    if args.is_int(ptr) and int(ptr) == 0:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {arg} is a null pointer")


@code("rt.free")
def free(dev_ptr):
    _not_null(dev_ptr, "rt.free", "dev_ptr")
    rt.free(dev_ptr)


@values("rt.malloc_host", 0)
def malloc_host(size):
    """An int address of pinned host memory (registered, so copies and free_host find it)."""
    return REGIONS.add_pinned(rt.malloc_host(size))


@code("rt.free_host")
def free_host(host_ptr):
    if not args.is_int(host_ptr):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"rt.free_host: {args.shown(host_ptr)} is not a host address")
    _not_null(host_ptr, "rt.free_host", "host_ptr")
    rt.free_host(REGIONS.remove_pinned(int(host_ptr), "rt.free_host"))


def _address(x, call: str, arg: str) -> tuple[bool, int]:
    """``(is_device, address)``: device addresses carry npusim's tag, every other int is a host address."""
    if not args.is_int(x):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {arg} {args.shown(x)} is not an address (an int)")
    x = int(x)
    return decode_addr(x) is not None, x


def _side(x, nbytes: int, call: str, arg: str):
    """``(is_device, what rt takes)`` for a memset: a device address as is, a host address as a uint8 view."""
    is_dev, x = _address(x, call, arg)
    return (True, x) if is_dev else (False, REGIONS.view(x, nbytes, call, arg))


_warned_kinds: set = set()


def _copy_args(call, dst, dest_max, src, count, kind):
    """The sides of a copy as rt takes them, and the kind the addresses make it (``kind`` is advisory)."""
    if not args.is_int(count) or not args.is_int(dest_max) or count < 0 or dest_max < 0:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: count {args.shown(count)} and dest_max "
                                                  f"{args.shown(dest_max)} must be non-negative ints")
    _not_null(dst, call, "dst")
    _not_null(src, call, "src")
    if count > dest_max:            # the runtime's check (rtMemcpy), not the ACL layer's: an RT code
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{call}: count {count} exceeds dest_max {dest_max}")
    dst_dev, d = _address(dst, call, "dst")
    src_dev, s = _address(src, call, "src")
    actual = KIND_OF_SIDES[(src_dev, dst_dev)]
    # host sides: a whole pinned buffer goes as itself (rt's fastest path), the rest as views
    resolve = REGIONS.view if actual == MemcpyKind.ACL_MEMCPY_HOST_TO_HOST else REGIONS.buffer
    if not dst_dev:
        d = resolve(d, count, call, "dst")
    if not src_dev:
        s = resolve(s, count, call, "src", write=False)
    given = given_kind(kind, call)
    if not kind_fits(given, actual):
        text = (f"{call}: kind {given.name} does not match the addresses, which make it {actual.name}; the "
                f"addresses decide, as in CANN (NPUSIM_ACL_STRICT=1 makes this an error)")
        if strict():
            raise AclError(E.ACL_ERROR_INVALID_PARAM, text)
        if (call, given, actual) not in _warned_kinds:
            _warned_kinds.add((call, given, actual))
            warnings.warn(text, RuntimeWarning, stacklevel=4)
    return d, s, actual


@code("rt.memcpy")
def memcpy(dst, dest_max, src, count, kind):
    d, s, actual = _copy_args("rt.memcpy", dst, dest_max, src, count, kind)
    rt.memcpy(d, dest_max, s, count, actual)


@code("rt.memcpy_async")
def memcpy_async(dst, dest_max, src, count, kind, stream):
    d, s, actual = _copy_args("rt.memcpy_async", dst, dest_max, src, count, kind)
    st = stream_of(stream, "rt.memcpy_async")
    if actual == MemcpyKind.ACL_MEMCPY_HOST_TO_HOST:
        rt.launch_callback(lambda _: np.copyto(d[:count], s[:count]), None, True, st)   # in stream order
    else:
        rt.memcpy_async(d, dest_max, s, count, actual, st)


def _fill(call, dev_ptr, max_count, value, count):
    """(device address or None, host view or None) after checking a memset's arguments."""
    for name, v in (("max_count", max_count), ("count", count)):
        if not args.is_int(v) or v < 0:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {name} must be a non-negative int, got {args.shown(v)}")
    _not_null(dev_ptr, call, "dev_ptr")
    if count > max_count:           # the runtime's check (rtMemset): an RT code
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{call}: count {count} exceeds max_count {max_count}")
    if not args.is_int(value) or not -(1 << 31) <= value < 1 << 32:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: value must be a C int32, got {args.shown(value)}")
    is_dev, side = _side(dev_ptr, count, call, "dev_ptr")
    return (side, None) if is_dev else (None, side)


def _byte(value) -> int:
    """The byte a memset writes: CANN passes the int32 value on and fills with its low byte."""
    return int(value) & 0xFF


@code("rt.memset")
def memset(dev_ptr, max_count, value, count):
    """Device or host memory: the address decides (CANN: "host or device memory")."""
    dev, host = _fill("rt.memset", dev_ptr, max_count, value, count)
    value = _byte(value)
    if dev is not None:
        rt.memset(dev, max_count, value, count)
    else:
        host[:count] = value


@code("rt.memset_async")
def memset_async(dev_ptr, max_count, value, count, stream):
    dev, host = _fill("rt.memset_async", dev_ptr, max_count, value, count)
    value = _byte(value)
    st = stream_of(stream, "rt.memset_async")
    if dev is not None:
        rt.memset_async(dev, max_count, value, count, st)
    else:                                                  # host memory, filled when the stream gets there
        rt.launch_callback(lambda _: host[:count].fill(value), None, True, st)


__all__ = ["create_context", "create_event", "create_event_ex_with_flag", "create_event_with_flag", "create_stream", "create_stream_with_config", "ctx_get_current_default_stream", "destroy_context", "destroy_event", "destroy_stream", "destroy_stream_force", "device_can_access_peer", "device_disable_peer_access", "device_enable_peer_access", "event_elapsed_time", "free", "free_host", "get_context", "get_device", "get_device_count", "get_mem_info", "get_run_mode", "launch_callback", "malloc", "malloc_align32", "malloc_cached", "malloc_host", "memcpy", "memcpy_async", "memset", "memset_async", "process_report", "query_event", "query_event_status", "record_event", "reset_device", "reset_device_force", "reset_event", "set_context", "set_device", "stream_query", "stream_wait_event", "subscribe_report", "synchronize_device", "synchronize_event", "synchronize_stream", "synchronize_stream_with_timeout", "unsubscribe_report"]
