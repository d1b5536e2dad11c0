"""torch_npu.testing.common_distributed: the skip decorators and process-group helpers of torch_npu's
distributed tests.

``skipIfUnsupportMultiNPU(n)`` skips a test only when fewer than ``n`` NPUs are visible: npusim's default config
has 8 simulated cards per node (``ASCEND_RT_VISIBLE_DEVICES`` narrows them), so multi-NPU tests run.
``with_comms`` / ``init_pg`` serve torch's ``MultiProcessTestCase`` (``self.rank``, ``self.world_size``,
``self.file_name``): each rank joins an ``"hccl"`` group over ``file://`` and binds to card ``rank``.
"""

from __future__ import annotations

import unittest
from collections import namedtuple
from functools import wraps

import torch
import torch.distributed as dist

import torch_npu  # noqa: F401  (torch.npu)

TestSkip = namedtuple("TestSkip", "exit_code, message")
TEST_SKIPS = {
    "multi-npu": TestSkip(75, "Multi-NPU condition not satisfied"),
    **{f"multi-npu-{n}": TestSkip(75, f"Need at least {n} ASCEND devices") for n in range(1, 9)},
    "hccl": TestSkip(76, "c10d not compiled with HCCL support"),
    "known_issues": TestSkip(77, "Test skipped due to known issues"),
}


def skipIfUnsupportMultiNPU(npu_number_needed):
    """Skip the test unless at least ``npu_number_needed`` NPUs are visible."""
    def skip_dec(func):
        @wraps(func)
        def wrapper(self, *args, **kwargs):
            if not torch.npu.is_available() or torch.npu.device_count() < npu_number_needed:
                raise unittest.SkipTest(f"Multi-NPU {npu_number_needed} condition not satisfied")
            return func(self, *args, **kwargs)
        return wrapper
    return skip_dec


def init_pg(backend: str = "hccl", world_size=1, rank=0, file_name="file://") -> None:
    """Join a ``backend`` ("hccl" or "gloo") group over ``file://file_name``; an hccl rank binds to card ``rank``."""
    if backend == "hccl" and torch.npu.device_count() < world_size:
        raise RuntimeError(TEST_SKIPS[f"multi-npu-{world_size}"].message)
    if backend not in ("hccl", "gloo"):
        raise RuntimeError(f"Backend {backend} not supported!")
    if backend == "hccl":
        torch.npu.set_device(rank)
    dist.init_process_group(backend=backend, world_size=world_size, rank=rank, init_method=f"file://{file_name}")


def with_comms(func):
    """Run a ``MultiProcessTestCase`` test inside a process group: hccl when enough NPUs are visible, else gloo."""
    if func is None:
        raise RuntimeError("Test function is None.")

    @wraps(func)
    def wrapper(self, *args, **kwargs):
        enough = torch.npu.is_available() and torch.npu.device_count() >= self.world_size
        init_pg(backend="hccl" if enough else "gloo", world_size=self.world_size, rank=self.rank,
                file_name=self.file_name)
        torch.npu.manual_seed(0)
        func(self, *args, **kwargs)
        destroy = getattr(self, "destroy_pg", None)
        if destroy is not None:
            destroy()
        else:
            dist.destroy_process_group()

    return wrapper
