"""torch_npu's shim in one process (world size 1, in-process cards): torch.npu, npu device names, argument errors
raised as c10d raises them. Prints "OK"."""

import os

import torch
import torch.distributed as dist
import torch_npu

assert torch.npu is torch_npu.npu and torch.npu.is_available()
assert torch.npu.device_count() == int(os.environ["EXPECT_DEVICES"]), torch.npu.device_count()
assert torch.npu.current_device() == 0

# npu device names give CPU tensors tied to the card
t = torch.ones(3).npu()
assert t.device.type == "cpu"
assert torch.ones(2, device="npu").device.type == "cpu" and torch.zeros(2, device=torch.device("npu", 1)).device.type == "cpu"
assert torch.randn(4, 3).to("npu:0").device.type == "cpu" and torch.randn(2).to(device="npu", dtype=torch.float64).dtype == torch.float64
model = torch.nn.Linear(3, 2).to(torch.device("npu:0"))
assert next(model.parameters()).device.type == "cpu" and model.npu() is model

for bad in (-1, 99, "cuda:0", "npu:x", True):
    try:
        torch.npu.set_device(bad)
    except (ValueError, RuntimeError) as e:
        assert "torch.npu.set_device" in str(e), e
    else:
        raise AssertionError(f"set_device({bad!r}) did not fail")
torch.npu.set_device("npu:1")
assert torch.npu.current_device() == 1

dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1)
assert dist.get_backend() == "hccl"
x = torch.arange(5.)
dist.all_reduce(x)
assert x.tolist() == [0, 1, 2, 3, 4]
torch.npu.synchronize()


def refused(fn, exc, words):
    try:
        fn()
    except exc as e:
        assert all(w in str(e) for w in words), (words, str(e))
    else:
        raise AssertionError(f"no {exc.__name__} with {words}")


refused(lambda: dist.all_reduce(torch.rand(2, 3).T), ValueError, ["Tensors must be contiguous"])
refused(lambda: dist.reduce_scatter(torch.tensor(2.), [torch.tensor(float(i)) for i in range(3)]), ValueError,
        ["must match number of collective participants"])
refused(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND), ValueError,
        ["ReduceOp.BAND is not supported"])
refused(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.AVG), ValueError,
        ["AVG needs a floating-point tensor"])
refused(lambda: dist.recv(torch.zeros(1)), RuntimeError, ["any source is not supported"])
refused(lambda: dist.all_gather([torch.zeros(2), torch.zeros(2)], torch.ones(2)), ValueError,
        ["one per rank of the group (1)"])
refused(lambda: dist.all_gather_into_tensor(torch.zeros(3), torch.ones(2)), ValueError, ["group size (1) times"])
refused(lambda: dist.all_reduce(torch.ones(2, dtype=torch.complex128), op=dist.ReduceOp.MAX), ValueError, ["complex"])
dist.destroy_process_group()
print("OK")
