"""``torch.npu``'s random-number calls: the generator behind ``npu`` tensors.

An ``npu`` tensor's kernels run on the host's CPU (docs/torch.md), and so do its random ops: every NPU shares
torch's CPU default generator. Seeding or reading "the NPU generator" — of one device or of all — seeds or
reads that one generator, so ``torch.npu.manual_seed(s)`` followed by ``torch.randn(..., device="npu")``
repeats exactly, as on hardware; what is not simulated is a separate stream of numbers per device.
"""

from __future__ import annotations

import torch

from .distributed.bootstrap import device_count


def _generator(device="npu") -> torch.Generator:
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type != "npu":
        raise ValueError(f"Expected a npu device, but got: {device}")
    return torch.default_generator


def manual_seed(seed) -> None:
    """Seed the current NPU's generator (the shared one)."""
    torch.default_generator.manual_seed(int(seed))


def manual_seed_all(seed) -> None:
    """Seed every NPU's generator (the shared one)."""
    torch.default_generator.manual_seed(int(seed))


def seed() -> None:
    """Seed the current NPU's generator with a non-deterministic number."""
    torch.default_generator.seed()


def seed_all() -> None:
    """Seed every NPU's generator with one non-deterministic number."""
    torch.default_generator.seed()


def initial_seed() -> int:
    return torch.default_generator.initial_seed()


def get_rng_state(device="npu") -> torch.Tensor:
    """The generator state of an NPU as a ByteTensor."""
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="npu") -> None:
    _generator(device).set_state(new_state.clone(memory_format=torch.contiguous_format))


def get_rng_state_all() -> list:
    """One state per visible NPU (all equal: they share a generator)."""
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


__all__ = ["get_rng_state", "get_rng_state_all", "initial_seed", "manual_seed", "manual_seed_all", "seed",
           "seed_all", "set_rng_state", "set_rng_state_all"]
