"""Device and pinned host memory of the current context (``rt.malloc``, ``rt.malloc_host``, stats, cache); the
diagnostics see allocations and frees through the seam (``seam.py``)."""

from __future__ import annotations

from .. import args
from ..addresses import decode_addr
from ..constants import AclErrorCode as E
from ..diag import slog
from ..errors import EL0004, AclError
from .hostmem import HostBuffer
from .runtime import RUNTIME, Context
from .seam import SEAM

LOG_BYTES = 1 << 20          # mallocs and frees from this size on are logged (DEBUG, module RUNTIME)


def malloc(size: int, policy: int = 0) -> int:
    """Device memory on the current device; returns its address (an int)."""
    ctx = RUNTIME.require_current("malloc")
    if not args.is_int(size) or size <= 0:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"malloc: size must be a positive int, got {args.shown(size)}")
    if size > args.INT64_MAX:
        raise AclError(E.ACL_ERROR_RT_MEMORY_ALLOCATION, f"{EL0004} malloc: out of memory: requested "
                                                         f"{args.shown(int(size))} "
                                                         f"bytes, far beyond the card's {RUNTIME.cfg.hbm_bytes}-byte "
                                                         f"capacity")
    policy = args.integer(policy, "malloc", "policy", hi=(1 << 32) - 1)
    if SEAM.on:
        SEAM.allocating(ctx, int(size))         # fault injection's oom fails it as on a full card
    ptr = ctx.client.call("malloc", int(size), policy)
    ctx.devmap.add(ptr, int(size))
    if SEAM.on:
        SEAM.allocated("dev", ptr, int(size))
    if size >= LOG_BYTES:
        slog.debug(slog.RUNTIME, "malloc: %d bytes at %#x on %s", size, ptr, ctx.name)
    return ptr


def free(ptr: int) -> None:
    ctx = ctx_for_ptr(ptr, "free")
    if slog.enabled(slog.RUNTIME, slog.DEBUG):
        size = ctx.devmap.size(ptr)
        if size is not None and size >= LOG_BYTES:
            slog.debug(slog.RUNTIME, "free: %d bytes at %#x on %s", size, ptr, ctx.name)
    if SEAM.on:
        SEAM.freeing("dev", ptr, "rt.free")
    ctx.devmap.remove(ptr)
    ctx.client.call("free", ptr)


def malloc_host(size: int) -> HostBuffer:
    """Pinned host memory: a writable shared-memory buffer cards copy to and from directly."""
    RUNTIME.require()
    buf = HostBuffer(size)
    if SEAM.on:
        SEAM.allocated("host", buf.address, buf.nbytes)
    return buf


def free_host(buf: HostBuffer) -> None:
    if not isinstance(buf, HostBuffer):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"free_host: {type(buf).__name__} is not a HostBuffer from malloc_host")
    if SEAM.on and not buf.freed:
        SEAM.freeing("host", buf.address, "rt.free_host")
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


def ctx_for_ptr(ptr, call) -> Context:
    """The current context; checks that ``ptr`` is a device address of this node."""
    ctx = RUNTIME.require_current(call)
    device_where(ptr, call, "ptr")
    return ctx


def device_where(ptr, call, arg):
    where = decode_addr(ptr) if isinstance(ptr, int) and not isinstance(ptr, bool) else None
    if where is None:
        shown = f"{ptr:#x}" if isinstance(ptr, int) else repr(type(ptr).__name__)
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{call}: {arg} {shown} is not a device address")
    if where[0] != RUNTIME.node:
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{call}: {arg} {ptr:#x} belongs to card {where[1]} of node "
                                                     f"{where[0]}, not this node ({RUNTIME.node})")
    return where
