"""torch_npu.testing.common_distributed: the skip decorators and process-group helpers of torch_npu's
distributed tests.

``skipIfUnsupportMultiNPU(n)`` skips a test only when fewer than ``n`` NPUs are visible: npusim's default config
has 8 simulated cards per node (``ASCEND_RT_VISIBLE_DEVICES`` narrows them), so multi-NPU tests run.
``with_comms`` / ``init_pg`` serve torch's ``MultiProcessTestCase`` (``self.rank``, ``self.world_size``,
``self.file_name``): each rank joins an ``"hccl"`` group over ``file://`` and binds to card ``rank``.
"""

from __future__ import annotations

import os
import unittest
from collections import namedtuple
from contextlib import contextmanager
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
    """Run a ``MultiProcessTestCase`` test inside a process group — hccl (``self.device_type = "npu"``) when at
    least ``self.world_size`` NPUs are visible, else gloo (``"cpu"``) — and destroy it after (``self.destroy_pg()``
    where the class has one)."""
    if func is None:
        raise RuntimeError("Test function is None.")

    @wraps(func)
    def wrapper(self, *args, **kwargs):
        enough = torch.npu.is_available() and torch.npu.device_count() >= self.world_size
        self.device_type = "npu" if enough else "cpu"
        init_pg(backend="hccl" if enough else "gloo", world_size=self.world_size, rank=self.rank,
                file_name=self.file_name)
        torch.npu.manual_seed(0)
        torch.npu.initial_seed()
        func(self, *args, **kwargs)
        destroy = getattr(self, "destroy_pg", None)
        if destroy is not None:
            destroy()
        else:
            dist.destroy_process_group()

    return wrapper


@contextmanager
def _dynamo_dist_per_rank_init(rank, world_size, init_pg_=True):
    """torch_npu's per-rank setup for dynamo tests: bind to card ``rank``, join an hccl group over
    ``localhost:6789`` (``env://``), and reset dynamo around the body."""
    import torch._dynamo
    torch.npu.set_device(rank)
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "6789"
    if init_pg_:
        dist.init_process_group(backend="hccl", rank=rank, world_size=world_size)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        yield
    finally:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        if init_pg_:
            dist.destroy_process_group()
