"""A distributed test file written as torch_npu's own are: torch's ``MultiProcessTestCase`` (a spawned process per
rank), ``@skipIfUnsupportMultiNPU(2)`` and ``@with_comms`` (each rank joins an "hccl" group over ``file://`` and
binds to card ``rank``), ``run_tests()`` at the bottom. Runs under ``python -m pytest`` and as ``python file.py``;
every result is checked against a gloo group over the same ranks or plain CPU torch.
"""

import unittest

try:
    import torch
    import torch.distributed as dist
    from torch.testing._internal.common_distributed import MultiProcessTestCase
except ImportError as e:                          # no torch, or no expecttest (which torch's test helpers need)
    raise unittest.SkipTest(f"torch's MultiProcessTestCase is unavailable: {e}") from e

import torch_npu  # noqa: F401
from torch_npu.testing.common_distributed import skipIfUnsupportMultiNPU, with_comms
from torch_npu.testing.testcase import run_tests


class HcclMultiProcessTest(MultiProcessTestCase):
    @property
    def world_size(self) -> int:
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _gloo(self):
        return dist.new_group(backend="gloo")

    @skipIfUnsupportMultiNPU(2)
    @with_comms
    def test_collectives_match_gloo(self):
        self.assertEqual(self.device_type, "npu")
        self.assertEqual(dist.get_backend(), "hccl")
        self.assertEqual(torch.npu.current_device(), self.rank)
        gloo = self._gloo()
        x = torch.arange(8, dtype=torch.float32) * (self.rank + 1)
        npu_x = x.npu()
        dist.all_reduce(npu_x)
        dist.all_reduce(x, group=gloo)
        self.assertEqual(npu_x.device, torch.device("npu", self.rank))
        self.assertEqual(npu_x.cpu(), x)
        outs = [torch.zeros(3, dtype=torch.int64).npu() for _ in range(self.world_size)]
        dist.all_gather(outs, torch.full((3,), self.rank + 10, dtype=torch.int64).npu())
        self.assertEqual([o.cpu().tolist() for o in outs], [[r + 10] * 3 for r in range(self.world_size)])
        y = torch.arange(2 * self.world_size, dtype=torch.float32) + self.rank
        out = torch.zeros(2).npu()
        dist.reduce_scatter_tensor(out, y.npu())
        ref = y.clone()
        dist.all_reduce(ref, group=gloo)
        self.assertEqual(out.cpu(), ref[2 * self.rank:2 * self.rank + 2])

    @skipIfUnsupportMultiNPU(2)
    @with_comms
    def test_cpu_tensor_is_refused_and_objects_still_travel(self):
        with self.assertRaisesRegex(RuntimeError, "^No backend type associated with device type cpu$"):
            dist.all_reduce(torch.ones(2))
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, {"rank": self.rank})
        self.assertEqual(gathered, [{"rank": r} for r in range(self.world_size)])
        dist.barrier()

    @skipIfUnsupportMultiNPU(2)
    @with_comms
    def test_ddp_step_matches_one_process(self):
        torch.manual_seed(0)
        model = torch.nn.Linear(6, 3)
        reference = torch.nn.Linear(6, 3)
        reference.load_state_dict(model.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(model.npu(), device_ids=[self.rank])
        data = torch.randn(4, 6, generator=torch.Generator().manual_seed(5))
        ddp(data[2 * self.rank:2 * self.rank + 2].npu()).sum().backward()
        reference(data).sum().backward()
        for p, q in zip(ddp.module.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad.cpu() * self.world_size, q.grad, rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    run_tests()
