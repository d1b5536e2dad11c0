"""The pyACL-style host API (``rt.*``): devices, memory, copies, streams, events, callbacks.

Failures raise (``AclError`` with the real code) instead of returning codes. What can be checked on
the host fails at once; failures inside queued work surface at the next covering synchronize.
"""

from __future__ import annotations

import builtins
import itertools
import queue
import sys
import threading
import traceback
import warnings

import numpy as np

from . import args, errors
from .constants import HBM, AclErrorCode as E, MemAttr, MemcpyKind
from .context import RUNTIME, Context
from .errors import AclError
from .hostmem import HostBuffer, pinned_region
from .memory import decode_addr

INLINE_MAX = 64 << 10          # pageable copies up to this size travel inside the message
_tokens = itertools.count(1)


# ====================================================================== lifecycle and devices
def init(config=None, *, address=None, backend=None) -> None:
    """Start the runtime: embedded local Ray (or join ``address``/RAY_ADDRESS; ``backend="local"``
    for in-process cards). Cards are created lazily at the first ``set_device``."""
    RUNTIME.init(config, address=address, backend=backend)


def finalize() -> None:
    """Release every context of this process and stop what ``init`` started."""
    RUNTIME.finalize()


def is_initialized() -> bool:
    return RUNTIME.initialized


def get_soc_name() -> str:
    RUNTIME.require()
    return RUNTIME.cfg.soc_name


def get_recent_err_msg() -> str | None:
    """This thread's most recent error text (newest first), cleared by the call, or None."""
    return errors.get_recent_err_msg()


def get_device_count() -> int:
    """Visible cards of this process's node (after ASCEND_RT_VISIBLE_DEVICES)."""
    RUNTIME.require()
    return len(RUNTIME.visible)


class DeviceInfo:
    def __init__(self, index, physical, node, cfg):
        self.index = index
        self.physical_id = physical
        self.node = node
        self.name = f"npu:{node}:{physical}"
        self.soc_name = cfg.soc_name
        self.total_memory = cfg.hbm_bytes
        self.topology = cfg.topology

    def __repr__(self):
        return f"DeviceInfo(index={self.index}, name={self.name!r}, soc_name={self.soc_name!r}, " \
               f"total_memory={self.total_memory})"


def get_device_info(device: int) -> DeviceInfo:
    return DeviceInfo(device, RUNTIME.physical(device), RUNTIME.node, RUNTIME.cfg)


def set_device(device: int) -> None:
    """Bind the calling thread to ``device`` (reference-counted per process; creates its default context)."""
    RUNTIME.physical(device)
    with RUNTIME.lock:
        ctx = RUNTIME.defaults.get(device)
        if ctx is None or ctx.destroyed:
            ctx = RUNTIME.open(device, default=True)
            RUNTIME.defaults[device] = ctx
        RUNTIME.refcount[device] = RUNTIME.refcount.get(device, 0) + 1
    RUNTIME.set_current(ctx)


def get_device() -> int:
    return RUNTIME.require_current("get_device").device


def _reset(device: int, force: bool) -> None:
    RUNTIME.physical(device)
    with RUNTIME.lock:
        count = RUNTIME.refcount.get(device, 0)
        if count == 0:
            raise AclError(E.ACL_ERROR_RT_INVALID_DEVICEID,
                           f"reset_device({device}): the device was not set in this process")
        count = 0 if force else count - 1
        RUNTIME.refcount[device] = count
        if count:
            return
        ctx = RUNTIME.defaults.pop(device, None)
    if ctx is not None:
        RUNTIME.destroy(ctx)
        if RUNTIME.current is None or RUNTIME.current is ctx:
            RUNTIME.set_current(None)


def reset_device(device: int) -> None:
    """Drop one reference; at zero the process's resources on the card are released."""
    _reset(device, force=False)


def reset_device_force(device: int) -> None:
    """Release the device now, whatever the reference count."""
    _reset(device, force=True)


def get_mem_info(attr=HBM) -> tuple[int, int]:
    """(free, total) bytes of the current device's memory."""
    if not args.is_int(attr) or int(attr) not in MemAttr._value2member_map_:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"get_mem_info: unknown memory attribute {args.shown(attr)} "
                                                  f"(expected an aclrtMemAttr 0..{max(MemAttr)})")
    ctx = RUNTIME.require_current("get_mem_info")
    free, total = ctx.client.call("mem_info")
    return free, total


def device_can_access_peer(device: int, peer: int) -> bool:
    """True for two distinct cards of this node (HCCS full mesh, or PCIe across the 910's groups)."""
    RUNTIME.physical(device)
    RUNTIME.physical(peer)
    return device != peer


def device_enable_peer_access(peer: int, flags: int = 0) -> None:
    ctx = RUNTIME.require_current("device_enable_peer_access")
    RUNTIME.physical(peer)
    if not args.is_int(flags) or flags != 0:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"device_enable_peer_access: flags must be 0, got {flags!r}")
    if peer == ctx.device:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"device_enable_peer_access: peer {peer} is the current device")


# ====================================================================== contexts
def create_context(device: int) -> Context:
    """A new context on ``device``, current for the calling thread; destroy it with destroy_context."""
    ctx = RUNTIME.open(device, default=False)
    RUNTIME.set_current(ctx)
    return ctx


def destroy_context(ctx: Context) -> None:
    if not isinstance(ctx, Context):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"destroy_context: {ctx!r} is not a context")
    if ctx.default:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, "destroy_context: a device's default context is released "
                                                  "by reset_device, not destroy_context")
    RUNTIME.destroy(ctx)
    if RUNTIME.current is None:
        RUNTIME.set_current(None)


def set_context(ctx: Context) -> None:
    RUNTIME.require()
    if not isinstance(ctx, Context):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"set_context: {ctx!r} is not a context")
    ctx.check()
    RUNTIME.set_current(ctx)


def get_context() -> Context:
    return RUNTIME.require_current("get_context")


def current_card():
    """The channel (``CardClient``) of the calling thread's current context."""
    return RUNTIME.require_current("current_card").client


# ====================================================================== memory
def malloc(size: int, policy: int = 0) -> int:
    """Device memory on the current device; returns its address (an int)."""
    ctx = RUNTIME.require_current("malloc")
    if not args.is_int(size) or size <= 0:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"malloc: size must be a positive int, got {args.shown(size)}")
    if size > args.INT64_MAX:
        raise AclError(E.ACL_ERROR_RT_MEMORY_ALLOCATION, f"malloc: out of memory: requested {int(size)} bytes, "
                                                         f"far beyond the card's {RUNTIME.cfg.hbm_bytes}-byte capacity")
    policy = args.integer(policy, "malloc", "policy", hi=(1 << 32) - 1)
    ptr = ctx.client.call("malloc", int(size), policy)
    ctx.devmap.add(ptr, int(size))
    return ptr


def free(ptr: int) -> None:
    ctx = _ctx_for_ptr(ptr, "free")
    ctx.devmap.remove(ptr)
    ctx.client.call("free", ptr)


def malloc_host(size: int) -> HostBuffer:
    """Pinned host memory: a writable shared-memory buffer cards copy to and from directly."""
    RUNTIME.require()
    return HostBuffer(size)


def free_host(buf: HostBuffer) -> None:
    if not isinstance(buf, HostBuffer):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"free_host: {type(buf).__name__} is not a HostBuffer from malloc_host")
    for ctx in list(RUNTIME.contexts):
        if buf.id in ctx.registered and not ctx.client.lost:
            ctx.registered.discard(buf.id)
            ctx.client.call("host_unregister", buf.id)
    buf.release()


def memory_stats(device: int | None = None) -> dict:
    """Allocator statistics in torch ``memory_stats`` key style."""
    return _ctx_for_device(device, "memory_stats").client.call("memory_stats")


def empty_cache(device: int | None = None) -> None:
    """Release cached (unused) segments back to the card."""
    _ctx_for_device(device, "empty_cache").client.call("empty_cache")


def _ctx_for_device(device, call) -> Context:
    if device is None:
        return RUNTIME.require_current(call)
    RUNTIME.physical(device)
    ctx = RUNTIME.defaults.get(device)
    if ctx is None:
        raise AclError(E.ACL_ERROR_RT_CONTEXT_NULL, f"{call}: device {device} is not set in this process")
    return ctx


def _ctx_for_ptr(ptr, call) -> Context:
    """The current context; checks that ``ptr`` is a device address of this node."""
    ctx = RUNTIME.require_current(call)
    _device_where(ptr, call, "ptr")
    return ctx


def _device_where(ptr, call, arg):
    where = decode_addr(ptr) if isinstance(ptr, int) and not isinstance(ptr, bool) else None
    if where is None:
        shown = f"{ptr:#x}" if isinstance(ptr, int) else repr(type(ptr).__name__)
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{call}: {arg} {shown} is not a device address")
    if where[0] != RUNTIME.node:
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{call}: {arg} {ptr:#x} belongs to card {where[1]} of node "
                                                     f"{where[0]}, not this node ({RUNTIME.node})")
    return where


# ====================================================================== copies
def _is_device(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and decode_addr(x) is not None


def _host_bytes(obj, call, arg, writable):
    """A uint8 view over a host-side argument (ndarray, bytes, bytearray, memoryview, HostBuffer)."""
    if isinstance(obj, (bytes,)) and writable:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {arg} is bytes, which is read-only; "
                                                  f"use a bytearray, numpy array or HostBuffer")
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {arg} numpy array of dtype {obj.dtype} holds Python "
                                                      f"objects, not bytes; copy numeric arrays only")
        if not obj.flags.c_contiguous:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {arg} numpy array must be C-contiguous")
        if writable and not obj.flags.writeable:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {arg} numpy array is read-only")
        return obj.reshape(-1).view(np.uint8)
    if isinstance(obj, (bytes, bytearray, memoryview, HostBuffer)):
        if isinstance(obj, HostBuffer) and obj.freed:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {arg} {obj!r} was freed")
        return np.frombuffer(obj, np.uint8) if not isinstance(obj, memoryview) else \
            np.frombuffer(obj.cast("B") if obj.contiguous else obj.tobytes(), np.uint8)
    if isinstance(obj, int):
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{call}: {arg} {obj:#x} is neither a device address nor a "
                                                     f"host buffer")
    raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {arg} of type {type(obj).__name__} is not a host buffer "
                                              f"(numpy array, bytes, bytearray, memoryview or HostBuffer)")


def _register(ctx: Context, buf: HostBuffer) -> None:
    if buf.id not in ctx.registered:
        ctx.client.call("host_register", buf.id, buf.nbytes, fds=[buf.fd])
        ctx.registered.add(buf.id)


class _Staging:
    """Per-context pool of pinned buffers used to carry large pageable copies."""

    def __init__(self):
        self.free: dict[int, list[HostBuffer]] = {}
        self.lock = threading.Lock()

    def get(self, ctx: Context, nbytes: int) -> HostBuffer:
        size = 1 << max(16, (nbytes - 1).bit_length())
        with self.lock:
            bucket = self.free.get(size)
            buf = bucket.pop() if bucket else None
        if buf is None:
            buf = HostBuffer(size)
        _register(ctx, buf)
        return buf

    def put(self, buf: HostBuffer) -> None:
        with self.lock:
            self.free.setdefault(buf.nbytes, []).append(buf)

    def release(self) -> None:
        """The context is gone: unmap the pooled buffers (a copy still using one keeps its own)."""
        with self.lock:
            pools, self.free = self.free, {}
        for bucket in pools.values():
            for buf in bucket:
                buf.release()


def _staging(ctx: Context) -> _Staging:
    st = getattr(ctx, "staging", None)
    if st is None:
        st = ctx.staging = _Staging()
    return st


_HOST_TYPES = (np.ndarray, bytes, bytearray, memoryview, HostBuffer)


def _infer_kind(dst, src, kind, call):
    for arg, x in (("dst", dst), ("src", src)):
        if isinstance(x, int) and not isinstance(x, bool) and not _is_device(x):
            _device_where(x, call, arg)          # a plain int is meant as an address: name it as a bad one
        if not isinstance(x, int) and not isinstance(x, _HOST_TYPES) or isinstance(x, bool):
            raise AclError(E.ACL_ERROR_INVALID_PARAM,
                           f"{call}: {arg} {args.shown(x)} is neither a device address (int) nor a host buffer "
                           f"(numpy array, bytes, bytearray, memoryview or HostBuffer)")
    dst_dev, src_dev = _is_device(dst), _is_device(src)
    actual = {(False, True): MemcpyKind.ACL_MEMCPY_HOST_TO_DEVICE, (True, False): MemcpyKind.ACL_MEMCPY_DEVICE_TO_HOST,
              (True, True): MemcpyKind.ACL_MEMCPY_DEVICE_TO_DEVICE, (False, False): MemcpyKind.ACL_MEMCPY_HOST_TO_HOST}[
        (src_dev, dst_dev)]
    if not args.is_int(kind) or int(kind) not in MemcpyKind._value2member_map_:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: unknown copy kind {args.shown(kind)} (expected 0..7)")
    kind = MemcpyKind(int(kind))
    accepted = {MemcpyKind.ACL_MEMCPY_DEFAULT: actual,
                MemcpyKind.ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE: MemcpyKind.ACL_MEMCPY_HOST_TO_DEVICE,
                MemcpyKind.ACL_MEMCPY_INNER_DEVICE_TO_DEVICE: MemcpyKind.ACL_MEMCPY_DEVICE_TO_DEVICE,
                MemcpyKind.ACL_MEMCPY_INTER_DEVICE_TO_DEVICE: MemcpyKind.ACL_MEMCPY_DEVICE_TO_DEVICE}.get(kind, kind)
    if accepted != actual:
        names = {True: "device address", False: "host buffer"}
        raise AclError(E.ACL_ERROR_INVALID_PARAM,
                       f"{call}: kind {kind.name} does not match the arguments: dst is a {names[dst_dev]}, src is a "
                       f"{names[src_dev]} (that is {actual.name})")
    return actual


def _check_counts(call, dst_max, count):
    for name, v in (("count", count), ("dst_max", dst_max)):
        if not args.is_int(v) or not 0 <= v <= args.INT64_MAX:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {name} must be a non-negative int, got {args.shown(v)}")
    if count > dst_max:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: count {count} exceeds dst_max {dst_max}")


def _host_len_check(call, arg, view, count):
    if view.nbytes < count:
        raise AclError(E.ACL_ERROR_INVALID_PARAM,
                       f"{call}: {arg} host buffer holds {view.nbytes} bytes, fewer than count {count}")


def memcpy(dst, dst_max: int, src, count: int, kind: int) -> None:
    """Synchronous copy of ``count`` bytes (host↔device, device↔device within or across cards of a node)."""
    call = "memcpy"
    _check_counts(call, dst_max, count)
    kind = _infer_kind(dst, src, kind, call)
    if kind == MemcpyKind.ACL_MEMCPY_HOST_TO_HOST:
        d, s = _host_bytes(dst, call, "dst", True), _host_bytes(src, call, "src", False)
        _host_len_check(call, "dst", d, count)
        _host_len_check(call, "src", s, count)
        d[:count] = s[:count]
        return
    ctx = RUNTIME.require_current(call)
    if count == 0:
        return
    cl = ctx.client
    if kind == MemcpyKind.ACL_MEMCPY_DEVICE_TO_DEVICE:
        _device_where(dst, call, "dst")
        _device_where(src, call, "src")
        cl.call("memcpy", ["dev", dst], ["dev", src], count)
    elif kind == MemcpyKind.ACL_MEMCPY_HOST_TO_DEVICE:
        _device_where(dst, call, "dst")
        s = _host_bytes(src, call, "src", False)
        _host_len_check(call, "src", s, count)
        desc, release = _src_desc(ctx, src, s, count)
        try:
            cl.call("memcpy", ["dev", dst], desc, count)
        finally:
            release()
    else:
        _device_where(src, call, "src")
        d = _host_bytes(dst, call, "dst", True)
        _host_len_check(call, "dst", d, count)
        pin = pinned_region(dst)
        if pin is not None:
            _register(ctx, pin[0])
            cl.call("memcpy", ["pin", pin[0].id, pin[1]], ["dev", src], count)
        elif count <= INLINE_MAX:
            d[:count] = np.frombuffer(cl.call("memcpy", ["ret"], ["dev", src], count), np.uint8)
        else:
            buf = _staging(ctx).get(ctx, count)
            try:
                cl.call("memcpy", ["pin", buf.id, 0], ["dev", src], count)
                d[:count] = np.frombuffer(buf, np.uint8, count)
            finally:
                _staging(ctx).put(buf)


def _src_desc(ctx, src, view, count):
    """Describe a host source for the card: pinned in place, inline, or through a staging buffer."""
    pin = pinned_region(src)
    if pin is not None:
        _register(ctx, pin[0])
        return ["pin", pin[0].id, pin[1]], lambda: None
    if count <= INLINE_MAX:
        return ["inline", view[:count].tobytes()], lambda: None
    st = _staging(ctx)
    buf = st.get(ctx, count)
    np.frombuffer(buf, np.uint8, count)[:] = view[:count]     # captured now: the source may change after
    return ["pin", buf.id, 0], lambda: st.put(buf)


def memcpy_async(dst, dst_max: int, src, count: int, kind: int, stream=None) -> None:
    """Enqueue a copy on ``stream``; returns at once. A pageable source is captured now; a pageable
    destination is filled no later than the synchronize that covers the copy."""
    call = "memcpy_async"
    _check_counts(call, dst_max, count)
    kind = _infer_kind(dst, src, kind, call)
    st = _stream(stream, call)
    ctx, cl = st.ctx, st.ctx.client
    if kind == MemcpyKind.ACL_MEMCPY_HOST_TO_HOST:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: host-to-host copies are synchronous; use memcpy")
    if count == 0:
        return
    if kind == MemcpyKind.ACL_MEMCPY_DEVICE_TO_DEVICE:
        _device_where(dst, call, "dst")
        _device_where(src, call, "src")
        cl.submit(st.id, "memcpy", ["dev", dst], ["dev", src], count)
    elif kind == MemcpyKind.ACL_MEMCPY_HOST_TO_DEVICE:
        _device_where(dst, call, "dst")
        s = _host_bytes(src, call, "src", False)
        _host_len_check(call, "src", s, count)
        desc, release = _src_desc(ctx, src, s, count)
        cl.submit(st.id, "memcpy", ["dev", dst], desc, count)
        _after(st, release)
    else:
        _device_where(src, call, "src")
        d = _host_bytes(dst, call, "dst", True)
        _host_len_check(call, "dst", d, count)
        pin = pinned_region(dst)
        if pin is not None:
            _register(ctx, pin[0])
            cl.submit(st.id, "memcpy", ["pin", pin[0].id, pin[1]], ["dev", src], count)
            return
        stg = _staging(ctx)
        buf = stg.get(ctx, count)
        cl.submit(st.id, "memcpy", ["pin", buf.id, 0], ["dev", src], count)

        def land():
            d[:count] = np.frombuffer(buf, np.uint8, count)
            stg.put(buf)
        _after(st, land)


def _after(st, fn) -> None:
    """Run ``fn`` on the host once the card has reached this point of the stream (before later replies)."""
    token = next(_tokens)
    st.ctx.notify[token] = fn
    st.ctx.client.submit(st.id, "notify", token)


def memset(ptr: int, max_count: int, value: int, count: int) -> None:
    """Set ``count`` bytes at ``ptr`` to ``value`` (synchronously)."""
    call = "memset"
    _check_counts(call, max_count, count)
    _memset_value(call, value)
    ctx = _ctx_for_ptr(ptr, call)
    if count:
        ctx.client.call("memset", ptr, int(value), count)


def memset_async(ptr: int, max_count: int, value: int, count: int, stream=None) -> None:
    call = "memset_async"
    _check_counts(call, max_count, count)
    _memset_value(call, value)
    _device_where(ptr, call, "ptr")
    st = _stream(stream, call)
    if count:
        st.ctx.client.submit(st.id, "memset", ptr, int(value), count)


def _memset_value(call, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= 255:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: value must be a byte (0..255), got {value!r}")


# ====================================================================== streams
class Stream:
    """A stream handle; ``None`` or ``0`` in any call means the current context's default stream."""

    def __init__(self, ctx: Context, sid: int):
        self.ctx = ctx
        self.id = sid
        self.destroyed = False

    def __repr__(self):
        return f"Stream({self.id} on {self.ctx.name}{', destroyed' if self.destroyed else ''})"


def _stream(stream, call) -> Stream:
    if stream is None or (isinstance(stream, int) and not isinstance(stream, bool) and stream == 0):
        ctx = RUNTIME.require_current(call)
        st = getattr(ctx, "default_stream", None)
        if st is None:
            st = ctx.default_stream = Stream(ctx, 0)
        return st
    return _live(stream, Stream, call, "a stream (use rt.create_stream())")


def _live(handle, cls, call, what):
    """``handle`` if it is a ``cls`` that is not destroyed (nor its context); else the ACL error."""
    if not isinstance(handle, cls):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {handle!r} is not {what}")
    if handle.destroyed or handle.ctx.destroyed:
        raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE, f"{call}: {handle!r} was destroyed")
    return handle


def create_stream() -> Stream:
    ctx = RUNTIME.require_current("create_stream")
    return Stream(ctx, ctx.client.call("stream_create"))


def destroy_stream(stream: Stream) -> None:
    """Destroy a stream; work already queued on it still runs."""
    st = _stream(stream, "destroy_stream")
    if st.id == 0:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, "destroy_stream: the default stream cannot be destroyed")
    st.ctx.client.retire_stream(st.id)
    st.destroyed = True


def synchronize_stream(stream=None) -> None:
    """Wait for all work on the stream; raises the first async failure of that work."""
    st = _stream(stream, "synchronize_stream")
    if not st.ctx.notify and st.ctx.client.stream_done(st.id):
        return          # the card finished all of it without errors, and every copy into host memory landed
    st.ctx.client.call("stream_sync", st.id, pass_req=True)


def synchronize_stream_with_timeout(stream, timeout_ms: int) -> None:
    """As synchronize_stream, but raises 507046 after ``timeout_ms`` (-1: no limit, 0: check now)."""
    st = _stream(stream, "synchronize_stream_with_timeout")
    if not args.is_int(timeout_ms) or not -1 <= timeout_ms < 1 << 31:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"synchronize_stream_with_timeout: timeout {timeout_ms!r} must be "
                                                  f"-1, 0 or a positive number of milliseconds")
    if timeout_ms == -1:
        return synchronize_stream(st)

    def expired():
        return AclError(E.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                        f"synchronize_stream_with_timeout: {st!r} still busy after {timeout_ms} ms")
    if timeout_ms == 0:
        if stream_query(st) != 0:
            raise expired()
        return synchronize_stream(st)
    st.ctx.client.call("stream_sync", st.id, pass_req=True, timeout=timeout_ms / 1000, timeout_error=expired)


def stream_query(stream=None) -> int:
    """ACL_STREAM_STATUS_COMPLETE (0) when all its work is done, else NOT_READY (1)."""
    st = _stream(stream, "stream_query")
    return st.ctx.client.call("stream_query", st.id)


def synchronize_device() -> None:
    """Wait for all streams of the current context; raises the first async failure."""
    ctx = RUNTIME.require_current("synchronize_device")
    _stream(None, "synchronize_device")          # make sure the default stream exists on the card
    ctx.client.call("default_stream")
    ctx.client.call("device_sync", pass_req=True)


def stream_wait_event(stream, event) -> None:
    """Make ``stream`` wait (on the card) for ``event``'s latest record — also one of another card."""
    st = _stream(stream, "stream_wait_event")
    ev = _event(event, "stream_wait_event")
    timeout = float(RUNTIME.cfg.exec_timeout) if RUNTIME.cfg else 1836.0
    st.ctx.client.submit(st.id, "wait_event", [ev.ctx.node, ev.ctx.physical], ev.id, ev.gen, timeout)


# ====================================================================== events
class Event:
    def __init__(self, ctx: Context, eid: int):
        self.ctx = ctx
        self.id = eid
        self.gen = 0                 # records issued from this host (the card completes them in order)
        self.destroyed = False

    def __repr__(self):
        return f"Event({self.id} on {self.ctx.name})"


def _event(event, call) -> Event:
    return _live(event, Event, call, "an event (use rt.create_event())")


def create_event() -> Event:
    ctx = RUNTIME.require_current("create_event")
    return Event(ctx, ctx.client.call("event_create"))


def destroy_event(event: Event) -> None:
    ev = _event(event, "destroy_event")
    ev.ctx.client.call("event_destroy", ev.id)
    ev.destroyed = True


def record_event(event: Event, stream=None) -> None:
    ev = _event(event, "record_event")
    st = _stream(stream, "record_event")
    if st.ctx.client is not ev.ctx.client and (st.ctx.node, st.ctx.physical) != (ev.ctx.node, ev.ctx.physical):
        raise AclError(E.ACL_ERROR_RT_STREAM_CONTEXT,
                       f"record_event: {ev!r} and {st!r} are on different cards")
    ev.gen += 1
    st.ctx.client.submit(st.id, "record", ev.id, ev.gen)


def reset_event(event: Event, stream=None) -> None:
    ev = _event(event, "reset_event")
    st = _stream(stream, "reset_event")
    ev.gen = 0
    st.ctx.client.submit(st.id, "reset_event", ev.id)


def query_event_status(event: Event) -> int:
    """ACL_EVENT_RECORDED_STATUS_COMPLETE (1) once the latest record completed, else NOT_READY (0)."""
    ev = _event(event, "query_event_status")
    return ev.ctx.client.call("event_query", ev.id)


def synchronize_event(event: Event) -> None:
    ev = _event(event, "synchronize_event")
    if ev.gen:
        ev.ctx.client.call("event_sync", ev.id, ev.gen, pass_req=True)


def event_elapsed_time(start: Event, end: Event) -> float:
    """Milliseconds between two completed records, measured on the card."""
    a, b = _event(start, "event_elapsed_time"), _event(end, "event_elapsed_time")
    if (a.ctx.node, a.ctx.physical) != (b.ctx.node, b.ctx.physical):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, "event_elapsed_time: the events are on different cards")
    return a.ctx.client.call("event_elapsed", a.id, b.id)


# ====================================================================== callbacks
def launch_callback(fn, user_data=None, block=True, stream=None) -> None:
    """Run ``fn(user_data)`` on a host thread of this process once prior work on the stream is done;
    a blocking callback holds the stream until it returns."""
    if not callable(fn):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"launch_callback: fn {args.shown(fn)} is not callable")
    block = args.flag(block, "launch_callback", "block")
    st = _stream(stream, "launch_callback")
    cb = next(_tokens)
    st.ctx.callbacks[cb] = (fn, user_data)
    timeout = float(RUNTIME.cfg.exec_timeout) if RUNTIME.cfg else 1836.0
    st.ctx.client.submit(st.id, "callback", cb, bool(block), timeout)


def _install_handlers(ctx: Context) -> None:
    """Wire a new context's notifications: stream-ordered host work and user callbacks."""
    jobs: queue.SimpleQueue = queue.SimpleQueue()

    def on_notify(token):
        fn = ctx.notify.get(token)
        if fn is not None:
            try:
                fn()
            finally:                    # only now: synchronize_stream's fast check looks at ctx.notify
                ctx.notify.pop(token, None)

    def on_callback(cb_id):
        jobs.put(cb_id)

    def worker():
        RUNTIME.set_current(ctx)        # so a callback can call rt (memcpy, record_event...) on its context
        while True:
            cb_id = jobs.get()
            if cb_id is None:
                return
            fn, data = ctx.callbacks.pop(cb_id, (None, None))
            try:
                if fn is not None:
                    fn(data)
            except Exception:
                text = traceback.format_exc()
                errors.record_error_message(f"launch_callback: {fn!r} raised:\n{text}")
                print(f"npusim: host callback {fn!r} raised:\n{text}", file=sys.stderr)
            finally:
                if not ctx.client.lost and not ctx.destroyed:
                    try:
                        ctx.client._send([0, 0, "callback_done", [cb_id]])   # reply ignored
                    except AclError:
                        pass

    shown: dict = {}                    # warnings registry: each distinct warning once, as Python's default

    def on_warning(payload):
        category, text, task, where = payload
        cls = getattr(builtins, category, None)
        if not (isinstance(cls, type) and issubclass(cls, Warning)):
            cls = RuntimeWarning
        warnings.warn_explicit(f"{text} (in a {task} task)", cls, f"<{where}>", 0, module="npusim.card",
                               registry=shown)

    ctx.client.handlers["notify"] = on_notify
    ctx.client.handlers["callback"] = on_callback
    ctx.client.handlers["warning"] = on_warning
    ctx.callback_jobs = jobs            # Runtime.destroy puts None here to end the worker
    threading.Thread(target=worker, name="npu-callbacks", daemon=True).start()
