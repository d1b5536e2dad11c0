"""``torch.npu``: the device calls torch_npu scripts make, answered by npusim's cards.

Tensors stay CPU tensors (``docs/torch.md``): what this module simulates is the *card* a rank is bound to —
``set_device`` binds the process to a card (the ``"hccl"`` process group's collectives run on it),
``device_count`` counts the visible cards, ``synchronize`` waits for the card and for this process's
outstanding collectives.
"""

from __future__ import annotations

import os

import torch

import rt
from rt.config import load_config

from .distributed import bootstrap
from .distributed.bootstrap import current_device, device_count
from .distributed.process_group import wait_all_groups


def _index(device, call: str) -> int:
    """A device index from an int, "npu", "npu:N" or torch.device("npu", N) (torch's own parsing)."""
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
        raise RuntimeError(f"torch.npu.{call}: invalid device {index}: this process sees {count} NPU(s) "
                           f"(ids 0..{count - 1}; ASCEND_RT_VISIBLE_DEVICES={os.environ.get('ASCEND_RT_VISIBLE_DEVICES')!r})")
    return index


def is_available() -> bool:
    return device_count() > 0


def set_device(device) -> None:
    """Bind this process to card ``device``; the runtime starts now where it can (under ``launch``, or a
    single process), else at ``init_process_group`` (under ``torchrun`` rank 0 hosts the cards)."""
    bootstrap.choose_device(_index(device, "set_device"))
    if bootstrap.runtime_ready_without_store():
        bootstrap.bind()


def synchronize(device=None) -> None:
    """Wait for this process's outstanding ``"hccl"`` collectives and for the card's streams."""
    wait_all_groups()
    if rt.is_initialized():
        if device is not None:
            _index(device, "synchronize")
        bootstrap.bind()
        rt.synchronize_device()


def get_device_name(device=None) -> str:
    if device is not None:
        _index(device, "get_device_name")
    return rt.get_soc_name() if rt.is_initialized() else load_config(None).soc_name


def is_initialized() -> bool:
    return rt.is_initialized()


def manual_seed(seed: int) -> None:
    """Tensors are CPU tensors here: seeding the NPU generator seeds torch's CPU generator (``torch.manual_seed``
    calls this too, through the device module)."""
    torch.default_generator.manual_seed(int(seed))


manual_seed_all = manual_seed


def _is_in_bad_fork() -> bool:
    """torch asks a device module this before seeding it: npusim's cards survive a fork of the host."""
    return False

__all__ = ["current_device", "device_count", "get_device_name", "is_available", "is_initialized", "manual_seed",
           "manual_seed_all", "set_device", "synchronize"]
