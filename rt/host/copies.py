"""Copies and memsets between host and device memory, synchronous and stream-ordered.

Pageable host memory is captured at enqueue (sources) or filled no later than the covering synchronize
(destinations): small copies travel inside the message, larger ones through a per-context pool of pinned
staging buffers; pinned buffers (``HostBuffer``) are mapped by the card and copied in place.
"""

from __future__ import annotations

import threading

import numpy as np

from .. import args
from ..addresses import decode_addr
from ..constants import AclErrorCode as E, MemcpyKind
from ..errors import AclError
from .hostmem import HostBuffer, pinned_region
from .memory import ctx_for_ptr, device_where
from .runtime import RUNTIME, Context
from .seam import SEAM, dev, host
from .streams import current_stream

INLINE_MAX = 64 << 10          # pageable copies up to this size travel inside the message


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
    if ctx.staging is None:
        ctx.staging = _Staging()
    return ctx.staging


_HOST_TYPES = (np.ndarray, bytes, bytearray, memoryview, HostBuffer)


# The copy kind two sides make, by (src is a device address, dst is one); and the kinds CANN takes for another.
KIND_OF_SIDES = {(False, True): MemcpyKind.ACL_MEMCPY_HOST_TO_DEVICE,
                 (True, False): MemcpyKind.ACL_MEMCPY_DEVICE_TO_HOST,
                 (True, True): MemcpyKind.ACL_MEMCPY_DEVICE_TO_DEVICE,
                 (False, False): MemcpyKind.ACL_MEMCPY_HOST_TO_HOST}
_SAME_AS = {MemcpyKind.ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE: MemcpyKind.ACL_MEMCPY_HOST_TO_DEVICE,
            MemcpyKind.ACL_MEMCPY_INNER_DEVICE_TO_DEVICE: MemcpyKind.ACL_MEMCPY_DEVICE_TO_DEVICE,
            MemcpyKind.ACL_MEMCPY_INTER_DEVICE_TO_DEVICE: MemcpyKind.ACL_MEMCPY_DEVICE_TO_DEVICE}


def given_kind(kind, call) -> MemcpyKind:
    """A copy's ``kind`` argument as a ``MemcpyKind`` (AclError 100000 for anything but 0..7)."""
    if not args.is_int(kind) or int(kind) not in MemcpyKind._value2member_map_:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: unknown copy kind {args.shown(kind)} (expected 0..7)")
    return MemcpyKind(int(kind))


def kind_fits(kind: MemcpyKind, actual: MemcpyKind) -> bool:
    """``kind`` names the copy the sides make (``actual``); ``ACL_MEMCPY_DEFAULT`` fits every copy."""
    return kind == MemcpyKind.ACL_MEMCPY_DEFAULT or _SAME_AS.get(kind, kind) == actual


def _infer_kind(dst, src, kind, call):
    for arg, x in (("dst", dst), ("src", src)):
        if isinstance(x, int) and not isinstance(x, bool) and not _is_device(x):
            device_where(x, call, arg)          # a plain int is meant as an address: name it as a bad one
        if not isinstance(x, int) and not isinstance(x, _HOST_TYPES) or isinstance(x, bool):
            raise AclError(E.ACL_ERROR_INVALID_PARAM,
                           f"{call}: {arg} {args.shown(x)} is neither a device address (int) nor a host buffer "
                           f"(numpy array, bytes, bytearray, memoryview or HostBuffer)")
    dst_dev, src_dev = _is_device(dst), _is_device(src)
    actual = KIND_OF_SIDES[(src_dev, dst_dev)]
    kind = given_kind(kind, call)
    if not kind_fits(kind, actual):
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
        if SEAM.accesses:
            SEAM.host_access("memcpy (host to host)", [host(s, count)], [host(d, count)])
        d[:count] = s[:count]
        return
    ctx = RUNTIME.require_current(call)
    if count == 0:
        return
    cl = ctx.client
    if kind == MemcpyKind.ACL_MEMCPY_DEVICE_TO_DEVICE:
        device_where(dst, call, "dst")
        device_where(src, call, "src")
        if SEAM.accesses:
            SEAM.host_access("memcpy (device to device)", [dev(src, count)], [dev(dst, count)])
        cl.call("memcpy", ["dev", dst], ["dev", src], count)
    elif kind == MemcpyKind.ACL_MEMCPY_HOST_TO_DEVICE:
        device_where(dst, call, "dst")
        s = _host_bytes(src, call, "src", False)
        _host_len_check(call, "src", s, count)
        if SEAM.accesses:
            SEAM.host_access("memcpy (host to device)", [host(s, count)], [dev(dst, count)])
        desc, release = _src_desc(ctx, src, s, count)
        try:
            cl.call("memcpy", ["dev", dst], desc, count)
        finally:
            release()
    else:
        device_where(src, call, "src")
        d = _host_bytes(dst, call, "dst", True)
        _host_len_check(call, "dst", d, count)
        if SEAM.accesses:
            SEAM.host_access("memcpy (device to host)", [dev(src, count)], [host(d, count)])
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
    st = current_stream(stream, call)
    ctx, cl = st.ctx, st.ctx.client
    if kind == MemcpyKind.ACL_MEMCPY_HOST_TO_HOST:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: host-to-host copies are synchronous; use memcpy")
    if count == 0:
        return
    if kind == MemcpyKind.ACL_MEMCPY_DEVICE_TO_DEVICE:
        device_where(dst, call, "dst")
        device_where(src, call, "src")
        cl.submit(st.id, "memcpy", ["dev", dst], ["dev", src], count)
        if SEAM.accesses:
            SEAM.enqueued(st, "memcpy_async (device to device)", [dev(src, count)], [dev(dst, count)])
    elif kind == MemcpyKind.ACL_MEMCPY_HOST_TO_DEVICE:
        device_where(dst, call, "dst")
        s = _host_bytes(src, call, "src", False)
        _host_len_check(call, "src", s, count)
        desc, release = _src_desc(ctx, src, s, count)
        cl.submit(st.id, "memcpy", ["dev", dst], desc, count)
        if SEAM.accesses:
            if desc[0] == "pin" and pinned_region(src) is not None:      # read in place when the stream gets there
                SEAM.enqueued(st, "memcpy_async (pinned host to device)", [host(s, count)], [dev(dst, count)])
            else:                                                        # a pageable source is captured now
                SEAM.host_access("memcpy_async (host to device: the source is read at the call)", [host(s, count)])
                SEAM.enqueued(st, "memcpy_async (host to device)", (), [dev(dst, count)])
        st.ctx.run_after(st.id, release)
    else:
        device_where(src, call, "src")
        d = _host_bytes(dst, call, "dst", True)
        _host_len_check(call, "dst", d, count)
        pin = pinned_region(dst)
        if pin is not None:
            _register(ctx, pin[0])
            cl.submit(st.id, "memcpy", ["pin", pin[0].id, pin[1]], ["dev", src], count)
            if SEAM.accesses:
                SEAM.enqueued(st, "memcpy_async (device to pinned host)", [dev(src, count)], [host(d, count)])
            return
        stg = _staging(ctx)
        buf = stg.get(ctx, count)
        cl.submit(st.id, "memcpy", ["pin", buf.id, 0], ["dev", src], count)
        if SEAM.accesses:       # the pageable destination is written when the covering synchronize lands it
            SEAM.enqueued(st, "memcpy_async (device to host)", [dev(src, count)], [host(d, count)])

        def land():
            d[:count] = np.frombuffer(buf, np.uint8, count)
            stg.put(buf)
        st.ctx.run_after(st.id, land)


def memset(ptr: int, max_count: int, value: int, count: int) -> None:
    """Set ``count`` bytes at ``ptr`` to ``value`` (synchronously)."""
    call = "memset"
    _check_counts(call, max_count, count)
    _memset_value(call, value)
    ctx = ctx_for_ptr(ptr, call)
    if count:
        if SEAM.accesses:
            SEAM.host_access("memset", (), [dev(ptr, count)])
        ctx.client.call("memset", ptr, int(value), count)


def memset_async(ptr: int, max_count: int, value: int, count: int, stream=None) -> None:
    call = "memset_async"
    _check_counts(call, max_count, count)
    _memset_value(call, value)
    device_where(ptr, call, "ptr")
    st = current_stream(stream, call)
    if count:
        st.ctx.client.submit(st.id, "memset", ptr, int(value), count)
        if SEAM.accesses:
            SEAM.enqueued(st, "memset_async", (), [dev(ptr, count)])


def _memset_value(call, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= 255:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: value must be a byte (0..255), got {args.shown(value)}")
