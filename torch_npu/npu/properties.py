"""What ``torch.npu`` says about the cards: availability, the runtime, names and properties, peer access,
utilization.

Device indices are the process's visible cards (``ASCEND_RT_VISIBLE_DEVICES``). ``get_device_properties``
describes the card (its SoC and HBM capacity from the config, or the running card's own answer).
"""

from __future__ import annotations

import os
import re
import warnings

import rt
from rt.config import load_config

from .. import _runtime
from .._error_code import ErrCode, pta_error
from ..distributed.bootstrap import device_count
from ..streams import device_index as _get_device_index
from .utils import soc_name

__all__ = ["NPUDeviceProperties", "can_device_access_peer", "get_device_capability", "get_device_name",
           "get_device_properties", "init", "is_available", "is_initialized", "utilization"]


def _valid(device, what: str = "device") -> int:
    """torch_npu's query check: the index of ``device`` (None: the current one), else AssertionError."""
    index = _get_device_index(device, optional=True)
    if index < 0 or index >= device_count():
        raise AssertionError(f"Invalid {what} id" + pta_error(ErrCode.VALUE))
    return index


def is_available() -> bool:
    return device_count() > 0


def is_initialized() -> bool:
    """Whether the runtime (the process's link to its cards) is running."""
    return rt.is_initialized()


def init() -> None:
    """Start the runtime now (``torch.npu`` calls that need a card do this themselves)."""
    _runtime.lazy_init()


def get_device_name(device_name=None) -> str:
    """The SoC name of the card (``Ascend910B1``...), as the config says."""
    _valid(device_name)
    return soc_name()


# cube cores, vector cores, L2 bytes of the SoCs npusim's configs name (Ascend's published figures)
_SOC_CORES = {"Ascend910B1": (24, 48, 192 << 20), "Ascend910B2": (24, 48, 192 << 20),
              "Ascend910B3": (20, 40, 192 << 20), "Ascend910B4": (20, 40, 96 << 20)}


class NPUDeviceProperties:
    """What ``get_device_properties`` returns (torch_npu's ``_NPUDeviceProperties`` fields). ``total_memory``
    is the card's HBM capacity; the core counts and L2 size are the SoC's (0 for a SoC npusim has no figures
    for)."""

    def __init__(self, index: int, name: str, total_memory: int):
        self.index = index
        self.name = name
        self.total_memory = total_memory
        self.cube_core_num, self.vector_core_num, self.L2_cache_size = _SOC_CORES.get(name, (0, 0, 0))
        self.multi_processor_count = self.cube_core_num
        self.major = self.minor = 0
        self.is_multi_gpu_board = False
        self.is_integrated = False
        self.uuid = f"npusim-{index:08d}"

    def __repr__(self):
        return (f"_NPUDeviceProperties(name='{self.name}', total_memory={self.total_memory // (1 << 20)}MB, "
                f"cube_core_num={self.cube_core_num}, vector_core_num={self.vector_core_num}, uuid={self.uuid}, "
                f"L2_cache_size={self.L2_cache_size // (1 << 20)}MB)")


def get_device_properties(device_name=None) -> NPUDeviceProperties:
    index = _valid(device_name)
    if rt.is_initialized():
        info = rt.get_device_info(index)
        return NPUDeviceProperties(index, info.soc_name, info.total_memory)
    cfg = load_config(None)
    return NPUDeviceProperties(index, cfg.soc_name, cfg.hbm_bytes)


_capability = None


def get_device_capability(device=None):
    """torch_npu's answer: ``None`` (with a warning) unless ``TORCH_NPU_DEVICE_CAPABILITY="major.minor"``."""
    global _capability
    note = ("The return value of get_device_capability is only for compatibility with PyTorch and does not "
            "represent the actual capability of the NPU device.")
    env = os.environ.get("TORCH_NPU_DEVICE_CAPABILITY")
    if not env:
        warnings.warn(f"You can set the device capability via the environment variable "
                      f"TORCH_NPU_DEVICE_CAPABILITY. {note}")
        return None
    match = re.match(r"^(\d+)\.(\d+)$", env)
    if not match:
        warnings.warn(f"torch.npu.get_device_capability can't parse TORCH_NPU_DEVICE_CAPABILITY environment "
                      f"variable: {env}. Expected format is 'major.minor' where major and minor are non-negative "
                      f"integers (e.g., '8.0').")
        return None
    warnings.warn(note)
    _capability = (int(match.group(1)), int(match.group(2)))
    return _capability


def can_device_access_peer(device_id, peer_device_id) -> bool:
    """True for two distinct cards of this node (every pair of a node's cards is linked)."""
    a = _valid(device_id)
    b = _valid(peer_device_id, "peer device")
    return a != b


def _is_in_bad_fork() -> bool:
    """torch asks a device module this before seeding it: npusim's cards survive a fork of the host."""
    return False


def utilization(device=None) -> int:
    """torch_npu's AI-core utilization rate: npusim's cards run no AI-core kernels (torch's kernels run on the
    host; ``npu-smi`` shows the rate as N/A), so there is no rate to report."""
    _valid(device)
    raise RuntimeError("torch.npu.utilization: npusim's cards run no AI-core kernels (operators run on the host), "
                       "so there is no utilization rate to report (npu-smi shows N/A)"
                       + pta_error(ErrCode.NOT_SUPPORT))
