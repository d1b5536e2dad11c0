"""``torch.npu`` (also ``torch_npu.npu``): the NPU calls torch_npu scripts make, answered by npusim's cards.

Device indices are the process's visible cards (``ASCEND_RT_VISIBLE_DEVICES``). ``set_device`` binds the process
to a card (the ``"hccl"`` process groups' collectives run on it); ``device(i)`` switches for a block;
``synchronize`` waits for the card's streams and this process's outstanding collectives;
``get_device_properties`` describes the card (its SoC and HBM capacity from the config); ``mem_get_info`` asks
the card; the memory statistics (``memory_allocated``...) are ``memory.py``'s. Streams and events (``Stream``,
``Event``, ``current_stream``, ``stream(s)``...) are the card's own streams and events (``streams.py``); RNG
(``rng.py``), ``amp`` (``amp.py``) and the compile options (``npu_config.py``) follow torch_npu's names. What is
and is not simulated: ``docs/torch.md``.
"""

from __future__ import annotations

import os
import re
import sys
import warnings

import torch

import rt
from rt.config import load_config

from . import _runtime, amp
from ._error_code import ErrCode, pta_error
from .amp import (get_amp_supported_dtype, get_autocast_dtype, is_autocast_enabled, set_autocast_dtype,
                  set_autocast_enabled)
from .distributed import bootstrap
from .distributed.bootstrap import current_device, device_count
from .distributed.process_group import wait_all_groups
from .memory import (empty_cache, max_memory_allocated, max_memory_reserved, mem_get_info, memory_allocated,
                     memory_reserved, memory_stats, memory_stats_as_nested_dict, memory_summary,
                     reset_accumulated_memory_stats, reset_max_memory_allocated, reset_peak_memory_stats)
from .npu_config import (CubeMathType, config, conv, get_mm_bmm_format_nd, is_jit_compile_false, matmul, set_aoe,
                         set_compile_mode, set_mm_bmm_format_nd, set_option)
from .rng import (get_rng_state, get_rng_state_all, initial_seed, manual_seed, manual_seed_all, seed, seed_all,
                  set_rng_state, set_rng_state_all)
from .streams import Event, Stream, StreamContext, current_stream, default_stream, set_stream, stream
from .streams import device_index as _get_device_index

sys.modules.setdefault(__name__ + ".amp", amp)      # `from torch_npu.npu.amp import GradScaler`

default_generators = (torch.default_generator,) * device_count()   # one shared generator (rng.py)


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


_lazy_init = init


def set_device(device) -> None:
    """Bind this process to card ``device``; the runtime starts now where it can (under ``launch``, or a
    single process), else at ``init_process_group`` (under ``torchrun`` rank 0 hosts the cards)."""
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


def get_device_name(device_name=None) -> str:
    """The SoC name of the card (``Ascend910B1``...), as the config says."""
    _valid(device_name)
    return rt.get_soc_name() if rt.is_initialized() else load_config(None).soc_name


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


def is_bf16_supported(including_emulation: bool = False) -> bool:
    """bfloat16 is supported from the 910B on (the older Ascend910A/ProB and the 310 series lack it)."""
    return not get_device_name().startswith(("Ascend910A", "Ascend910P", "Ascend310"))


def _is_in_bad_fork() -> bool:
    """torch asks a device module this before seeding it: npusim's cards survive a fork of the host."""
    return False


__all__ = ["CubeMathType", "Event", "NPUDeviceProperties", "Stream", "StreamContext", "amp",
           "can_device_access_peer", "config", "conv", "current_device", "current_stream", "default_generators",
           "default_stream", "device", "device_count", "device_of", "empty_cache", "get_amp_supported_dtype",
           "get_autocast_dtype", "get_device_capability", "get_device_name", "get_device_properties",
           "get_mm_bmm_format_nd", "get_rng_state", "get_rng_state_all", "init", "initial_seed",
           "is_autocast_enabled", "is_available", "is_bf16_supported", "is_initialized", "is_jit_compile_false",
           "manual_seed", "manual_seed_all", "matmul", "max_memory_allocated", "max_memory_reserved", "mem_get_info",
           "memory_allocated", "memory_reserved", "memory_stats", "memory_stats_as_nested_dict", "memory_summary",
           "reset_accumulated_memory_stats", "reset_max_memory_allocated", "reset_peak_memory_stats", "seed",
           "seed_all", "set_aoe",
           "set_autocast_dtype", "set_autocast_enabled", "set_compile_mode", "set_device",
           "set_mm_bmm_format_nd", "set_option", "set_rng_state", "set_rng_state_all", "set_stream", "stream",
           "synchronize"]
