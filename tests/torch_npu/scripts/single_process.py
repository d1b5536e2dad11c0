"""torch_npu's shim in one process (world size 1, in-process cards): torch.npu, npu device names, argument errors
raised as c10d raises them. Prints "OK"."""

import os

import torch
import torch.distributed as dist

import torch_npu

assert torch.npu is torch_npu.npu and torch.npu.is_available()
assert torch.npu.device_count() == int(os.environ["EXPECT_DEVICES"]), torch.npu.device_count()
assert torch.npu.current_device() == 0

# npu device names work (what they give is torch_npu/devices.py's business, tested with it)
t = torch.ones(3).npu()
model = torch.nn.Linear(3, 2).to(torch.device("npu:0"))
assert model.npu() is model

torch.npu.set_device(-1)                     # a negative index is a no-op, as torch_npu's `if device_id >= 0`
assert torch.npu.current_device() == 0
for bad in (99, "cuda:0", "npu:x", True):
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
x = torch.arange(5.).npu()
dist.all_reduce(x)
assert x.cpu().tolist() == [0, 1, 2, 3, 4]
torch.npu.synchronize()


def refused(fn, exc, words):
    try:
        fn()
    except exc as e:
        assert all(w in str(e) for w in words), (words, str(e))
        assert type(e) is exc, (exc, type(e), str(e))
    else:
        raise AssertionError(f"no {exc.__name__} with {words}")


# ProcessGroupHCCL's own checks and texts, each ending with torch_npu's error-code line
refused(lambda: dist.all_reduce(torch.rand(2, 3).npu().T), RuntimeError, ["Tensors must be contiguous\n[ERROR] ",
                                                                          "ERR02002 DIST invalid type"])
refused(lambda: dist.reduce_scatter(torch.tensor(2.).npu(), [torch.tensor(float(i)).npu() for i in range(3)]),
        RuntimeError, ["Tensor list input to scatter/gather must match number of collective participants"])
refused(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32).npu(), op=dist.ReduceOp.BAND), RuntimeError,
        ["Cannot use ReduceOp.BAND with HCCL", "ERR02007 DIST feature not supported"])
refused(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32).npu(), op=dist._make_nccl_premul_sum(2.0)),
        RuntimeError, ["PreMulSum Data type must be half, float, bfloat16 or double"])
refused(lambda: dist.all_reduce(torch.ones(2, dtype=torch.float64).npu()), RuntimeError,
        ["HCCL allreduce: Unsupported data type at::kDouble"])
refused(lambda: dist.recv(torch.zeros(1).npu()), RuntimeError, ["ProcessGroupHCCL does not support recv"])
refused(lambda: dist.all_gather([torch.zeros(2).npu(), torch.zeros(2).npu()], torch.ones(2).npu()), RuntimeError,
        ["Tensor list input to scatter/gather must match number of collective participants"])
refused(lambda: dist.all_gather_into_tensor(torch.zeros(3).npu(), torch.ones(2).npu()), RuntimeError,
        ["output tensor size must be equal to world_size times input tensor size"])
refused(lambda: dist.all_reduce(torch.ones(2, dtype=torch.complex128).npu(), op=dist.ReduceOp.MAX), ValueError,
        ["complex"])
os.environ["TORCH_NPU_COMPACT_ERROR_OUTPUT"] = "1"
try:
    dist.all_reduce(torch.rand(2, 3).npu().T)
except RuntimeError as e:
    assert str(e) == "Tensors must be contiguous", str(e)
dist.destroy_process_group()
print("OK")
