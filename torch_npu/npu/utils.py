"""``torch_npu.npu.utils``: selecting the card, synchronizing with it, and what the SoC supports.

torch_npu's names and arguments. ``set_device`` binds the process to a card (the ``"hccl"`` process groups'
collectives run on it; a negative index is a no-op, as in torch_npu); ``device(i)`` switches for a block;
``synchronize`` waits for the card's streams and this process's outstanding collectives. The SoC answers
(``get_soc_version``, ``is_support_inf_nan``, ``is_bf16_supported``) follow torch_npu's rules for the SoC the
config names (``Ascend910B1`` by default). npusim installs no CANN packages, so ``get_cann_version`` answers as
torch_npu does when CANN reports no version: ``""``.
"""

from __future__ import annotations

import os
import warnings

import torch

import rt
from rt.config import load_config

from .. import _runtime
from .._error_code import ErrCode, pta_error
from ..distributed import bootstrap
from ..distributed.bootstrap import current_device, device_count
from ..distributed.process_group import wait_all_groups
from ..streams import StreamContext, current_stream, default_stream, set_stream, stream
from ..streams import device_index as _get_device_index

__all__ = ["synchronize", "set_device", "current_device", "device", "device_of", "StreamContext", "stream",
           "set_stream", "current_stream", "default_stream", "set_sync_debug_mode", "get_sync_debug_mode",
           "is_support_inf_nan", "is_bf16_supported", "get_npu_overflow_flag", "npu_check_overflow",
           "clear_npu_overflow_flag", "current_blas_handle", "get_cann_version", "get_soc_version", "ipc_collect"]

# torch_npu's SocVersion numbers (c10_npu::SocVersion) of the SoC names CANN reports
_SOC_VERSIONS = {"Ascend910PremiumA": 100, "Ascend910ProA": 101, "Ascend910A": 102, "Ascend910ProB": 103,
                 "Ascend910B": 104, "Ascend310P1": 200, "Ascend310P2": 201, "Ascend310P3": 202, "Ascend310P4": 203,
                 "Ascend310P5": 204, "Ascend310P7": 205, "Ascend910B1": 220, "Ascend910B2": 221,
                 "Ascend910B2C": 222, "Ascend910B3": 223, "Ascend910B4": 224, "Ascend910B4-1": 225,
                 "Ascend310B1": 240, "Ascend310B2": 241, "Ascend310B3": 242, "Ascend310B4": 243,
                 "Ascend910_9391": 250, "Ascend910_9392": 251, "Ascend910_9381": 252, "Ascend910_9382": 253,
                 "Ascend910_9372": 254, "Ascend910_9362": 255, "Ascend910_9363": 256, "Ascend950": 260}
_ASCEND910B1, _ASCEND310B1, _ASCEND910_9391, _ASCEND950 = 220, 240, 250, 260
_CANN_MODULES = ("CANN", "RUNTIME", "COMPILER", "HCCL", "TOOLKIT", "OPP", "OPP_KERNEL", "DRIVER")
_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}
_sync_debug_mode = 0


def _index(device, call: str) -> int:
    """A device index from an int, "npu", "npu:N" or torch.device("npu", N), checked against the visible cards."""
    if isinstance(device, bool):
        raise ValueError(f"torch.npu.{call}: expected a device, got {device!r}")
    if isinstance(device, int):
        index = device
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError):
            raise ValueError(f"torch.npu.{call}: invalid device {device!r} (expected an int, 'npu', 'npu:N' or "
                             f"torch.device('npu', N))") from None
        if dev.type != "npu":
            raise ValueError(f"torch.npu.{call}: expected an npu device, got {dev}")
        index = current_device() if dev.index is None else dev.index
    count = device_count()
    if not 0 <= index < count:
        visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
        raise RuntimeError(f"torch.npu.{call}: invalid device {index}: this process sees {count} NPU(s) "
                           f"(ids 0..{count - 1}; ASCEND_RT_VISIBLE_DEVICES={visible!r})")
    return index


def set_device(device) -> None:
    """Bind this process to card ``device``; a negative index does nothing (torch_npu's ``if device_id >= 0``).
    The runtime starts now where it can (under ``launch``, or a single process), else at ``init_process_group``
    (under ``torchrun`` rank 0 hosts the cards)."""
    if isinstance(device, int) and not isinstance(device, bool) and device < 0:
        return
    bootstrap.choose_device(_index(device, "set_device"))
    if bootstrap.runtime_ready_without_store():
        bootstrap.bind()


def synchronize(device=None) -> None:
    """Wait for this process's outstanding ``"hccl"`` collectives and for every stream of the card."""
    wait_all_groups()
    index = current_device() if device is None else _index(device, "synchronize")
    if rt.is_initialized():
        with _runtime.on(index):
            rt.synchronize_device()


class device:
    """Context manager selecting NPU ``device`` for its body (``None`` or a negative index: no-op).

    The selection is the process's (what ``set_device`` sets), not only the calling thread's."""

    def __init__(self, device):
        self.idx = -1 if device is None else _get_device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx < 0:
            return
        self.prev_idx = current_device()
        if self.prev_idx != self.idx:
            set_device(self.idx)

    def __exit__(self, *exc):
        if self.idx >= 0 and self.prev_idx != self.idx:
            set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager selecting the device of tensor ``obj`` (a no-op for a tensor that is not on an NPU)."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if getattr(obj, "is_npu", False) else -1)


def soc_name() -> str:
    """The SoC of the cards: the running runtime's, else the config's."""
    return rt.get_soc_name() if rt.is_initialized() else load_config(None).soc_name


def get_soc_version() -> int:
    """torch_npu's SocVersion number of the SoC (220 for Ascend910B1; -1 for a name torch_npu does not know)."""
    return _SOC_VERSIONS.get(soc_name(), -1)


def _env_flag(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None else value.strip()


def is_support_inf_nan() -> bool:
    """Whether the SoC computes in INF/NaN mode (the 910B family, 910_93 and 950) rather than saturation mode;
    ``INF_NAN_MODE_ENABLE=0`` / ``INF_NAN_MODE_FORCE_DISABLE=1`` as torch_npu reads them."""
    soc = get_soc_version()
    if soc >= _ASCEND950:
        return True
    default = _ASCEND910B1 <= soc < _ASCEND310B1 or soc >= _ASCEND910_9391
    force_disable = _env_flag("INF_NAN_MODE_FORCE_DISABLE") == "1"
    if _env_flag("INF_NAN_MODE_ENABLE") == "0":
        if default and not force_disable:
            raise RuntimeError("INF_NAN_MODE_ENABLE shouldn't be set to 0 on the current device. If you want to "
                               "disable inf-nan mode, please export INF_NAN_MODE_FORCE_DISABLE=1")
        return False
    return default and not force_disable


def is_bf16_supported(including_emulation: bool = False) -> bool:
    """bfloat16 from the 910B on (torch_npu: SocVersion >= Ascend910B1); not on the 910A/ProB or 310P."""
    return get_soc_version() >= _ASCEND910B1


def get_npu_overflow_flag() -> bool:
    """The saturation-mode overflow flag: the SoCs npusim simulates run in INF/NaN mode, where torch_npu refuses
    this call (use ``npu_check_overflow``)."""
    if is_support_inf_nan():
        raise RuntimeError("Unsupported api when soc_version >= Ascend910B1, please use npu_check_overflow"
                           + pta_error(ErrCode.NOT_SUPPORT))
    raise RuntimeError(f"get_npu_overflow_flag: the saturation-mode float status register of {soc_name()} is not "
                       f"simulated by npusim" + pta_error(ErrCode.NOT_SUPPORT))


def npu_check_overflow(grad) -> bool:
    """INF/NaN mode: whether ``grad`` (a tensor or a float) sums to inf or NaN."""
    if not is_support_inf_nan():
        return get_npu_overflow_flag()
    if isinstance(grad, float):
        total = grad
    elif isinstance(grad, torch.Tensor):
        total = float(grad.float().sum())
    else:
        raise RuntimeError("Unsupported type." + pta_error(ErrCode.TYPE))
    return total in (float("inf"), float("-inf")) or total != total


def clear_npu_overflow_flag() -> None:
    """Nothing to clear in INF/NaN mode (torch_npu warns so)."""
    if is_support_inf_nan():
        warnings.warn("When soc_version >= Ascend910B1, clear_npu_overflow_flag is useless. Please remove it.")
        return
    get_npu_overflow_flag()


def current_blas_handle():
    """NPUs have no BLAS handle: torch_npu warns and returns None."""
    warnings.warn("NPU does not use blas handle.")
    return None


def get_cann_version(module: str = "CANN") -> str:
    """The version of a CANN package: ``""`` — npusim installs none, and torch_npu answers ``""`` for a package
    CANN does not report (and for an unknown module name)."""
    if not isinstance(module, str):
        raise TypeError(f"get_cann_version(): argument 'module' must be str, not {type(module).__name__}")
    return ""


def ipc_collect() -> None:
    """Release memory held for npu tensors sent to other processes: npusim's npu tensors are never shared
    between processes (docs/torch.md), so there is none; the runtime starts as in torch_npu."""
    _runtime.lazy_init()


def set_sync_debug_mode(debug_mode) -> None:
    """``"default"``/0, ``"warn"``/1 or ``"error"``/2, remembered for ``get_sync_debug_mode``. npusim's kernels
    run on the host when called, so no operator synchronizes with the card and none warns or errors."""
    global _sync_debug_mode
    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG_MODES:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`"
                               + pta_error(ErrCode.PARAM))
        debug_mode = _SYNC_DEBUG_MODES[debug_mode]
    if isinstance(debug_mode, bool) or not isinstance(debug_mode, int):
        raise TypeError(f"set_sync_debug_mode(): argument 'debug_mode' must be str or int, not "
                        f"{type(debug_mode).__name__}" + pta_error(ErrCode.TYPE))
    _sync_debug_mode = min(max(debug_mode, 0), 2)         # as c10's warning_state, out-of-range values clamp


def get_sync_debug_mode() -> int:
    return _sync_debug_mode
