"""Lifecycle, devices and contexts (``rt.init``, ``rt.set_device``, ``rt.create_context``, ...)."""

from __future__ import annotations

from .. import args, errors
from ..constants import HBM, AclErrorCode as E, MemAttr
from ..diag import slog
from ..errors import AclError
from .runtime import RUNTIME, Context
from .seam import SEAM


def init(config=None, *, address=None, backend=None) -> None:
    """Start the runtime: embedded local Ray (or join ``address``/RAY_ADDRESS; ``backend="local"``
    for in-process cards). Cards are created lazily at the first ``set_device``."""
    if not RUNTIME.initialized:
        SEAM.starting()                   # NPUSIM_FAULTS is read now: a malformed spec fails here (100000)
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
        count = RUNTIME.refcount[device] = RUNTIME.refcount.get(device, 0) + 1
    RUNTIME.set_current(ctx)
    slog.info(slog.RUNTIME, "set_device(%d): card %d of node %d, %d reference(s)", device, ctx.physical, ctx.node,
              count)


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
            slog.info(slog.RUNTIME, "reset_device(%d): %d reference(s) left", device, count)
            return
        ctx = RUNTIME.defaults.pop(device, None)
    slog.info(slog.RUNTIME, "reset_device(%d)%s: releasing the device", device, " (force)" if force else "")
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
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"device_enable_peer_access: flags must be 0, got "
                                                  f"{args.shown(flags)}")
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
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"destroy_context: {args.shown(ctx)} is not a context")
    if ctx.destroyed:                   # a second destroy is the program's bug: CANN refuses it (107002)
        raise AclError(E.ACL_ERROR_RT_CONTEXT_NULL, f"destroy_context: the context of {ctx.name} was destroyed "
                                                    f"already")
    if ctx.default:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, "destroy_context: a device's default context is released "
                                                  "by reset_device, not destroy_context")
    RUNTIME.destroy(ctx)
    if RUNTIME.current is None:
        RUNTIME.set_current(None)


def set_context(ctx: Context) -> None:
    RUNTIME.require()
    if not isinstance(ctx, Context):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"set_context: {args.shown(ctx)} is not a context")
    ctx.check()
    RUNTIME.set_current(ctx)


def get_context() -> Context:
    return RUNTIME.require_current("get_context")


def current_card():
    """The channel (``CardClient``) of the calling thread's current context."""
    return RUNTIME.require_current("current_card").client
