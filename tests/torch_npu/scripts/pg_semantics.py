"""ProcessGroupHCCL's behaviour beyond the common collectives (those are in vs_gloo.py), checked against gloo or a
plain-torch oracle: PREMUL_SUM, integer AVG, bool and uint8 reductions, uneven all_gather / reduce_scatter
(torch_npu's AllGatherV / ReduceScatterV), the list and flat forms and the backend's ``_allgather_base`` /
``_reduce_scatter_base``, send/recv and batch_isend_irecv to the own rank, and argument mistakes refused with
torch_npu's exception types and texts. Prints "SEMANTICS OK (<mode>)".

    launch --nproc 3 tests/torch_npu/scripts/pg_semantics.py
"""

import os
import warnings

import torch
import torch.distributed as dist

import torch_npu  # noqa: F401
from torch_npu.distributed import checks, process_group

dist.init_process_group("hccl")
RANK, WORLD = dist.get_rank(), dist.get_world_size()
torch.npu.set_device(int(os.environ["LOCAL_RANK"]))
GLOO = dist.new_group(backend="gloo")
NXT, PRV = (RANK + 1) % WORLD, (RANK - 1) % WORLD


def same(a, b, what, exact=True):
    a, b = a.cpu(), b.cpu()
    if exact:
        assert torch.equal(a, b), f"rank {RANK}: {what}: hccl {a} != oracle {b}"
    else:
        torch.testing.assert_close(a, b, msg=lambda m: f"rank {RANK}: {what}: {m}")


def refused(fn, exc, *words):
    try:
        fn()
    except exc as e:
        assert type(e) is exc and all(w in str(e) for w in words), (exc, type(e), words, str(e))
    else:
        raise AssertionError(f"rank {RANK}: no {exc.__name__} with {words}")


def gloo_sum(t):
    t = t.clone()
    dist.all_reduce(t, group=GLOO)
    return t


# -- reductions torch_npu adds around HCCL's four ------------------------------------------------------------------
x = torch.arange(6, dtype=torch.float32) * (RANK + 1) - 2
h = x.npu()
dist.all_reduce(h, op=dist._make_nccl_premul_sum(0.5))
same(h, gloo_sum(x) * 0.5, "all_reduce PREMUL_SUM(0.5)", exact=False)
h = torch.zeros(2).npu()
dist.reduce_scatter_tensor(h, x.npu(), op=dist._make_nccl_premul_sum(3.0))
same(h, (gloo_sum(x) * 3.0)[2 * RANK:2 * RANK + 2], "reduce_scatter_tensor PREMUL_SUM(3)", exact=False)
i = torch.tensor([3 * RANK + 1, -(3 * RANK + 1), 7], dtype=torch.int32)
h = i.npu()
dist.all_reduce(h, op=dist.ReduceOp.AVG)                      # integers: truncating division, as torch_npu on A5
same(h, torch.div(gloo_sum(i), WORLD, rounding_mode="trunc"), "all_reduce AVG int32")
u = torch.tensor([200, 100, 3], dtype=torch.uint8) + RANK
h = u.npu()
dist.all_reduce(h)                                            # int32 detour, wraps back into uint8 as gloo does
same(h, gloo_sum(u), "all_reduce uint8 SUM")
flags = [torch.tensor([r == 0, True, r % 2 == 1, False]) for r in range(WORLD)]
for op, expect in ((dist.ReduceOp.SUM, torch.stack(flags).any(0)), (dist.ReduceOp.PRODUCT, torch.stack(flags).all(0)),
                   (dist.ReduceOp.MAX, torch.stack(flags).any(0)), (dist.ReduceOp.MIN, torch.stack(flags).all(0))):
    h = flags[RANK].npu()
    dist.all_reduce(h, op=op)
    same(h, expect, f"all_reduce bool {op}")

# -- list and flat forms, even and uneven -----------------------------------------------------------------------------
blocks = [torch.arange(r + 1, dtype=torch.int64) + 10 * r for r in range(WORLD)]           # rank r gathers r+1 items
outs = [torch.zeros(r + 1, dtype=torch.int64).npu() for r in range(WORLD)]
dist.all_gather(outs, blocks[RANK].npu())                                                   # torch_npu's AllGatherV
for r in range(WORLD):
    same(outs[r], blocks[r], f"uneven all_gather block {r}")
mine = [(torch.arange(r + 2, dtype=torch.float32) + RANK) for r in range(WORLD)]          # rank r receives r+2 items
h = torch.zeros(RANK + 2).npu()
dist.reduce_scatter(h, [t.npu() for t in mine])                                             # torch_npu's ReduceScatterV
same(h, torch.arange(RANK + 2, dtype=torch.float32) * WORLD + sum(range(WORLD)), "uneven reduce_scatter")
inp = torch.arange(4 * WORLD, dtype=torch.int32) * (RANK + 2)
listed = torch.zeros(4, dtype=torch.int32).npu()
dist.reduce_scatter(listed, [c.npu() for c in inp.chunk(WORLD)])
flat, stacked = torch.zeros(4, dtype=torch.int32).npu(), torch.zeros(4, dtype=torch.int32).npu()
dist.reduce_scatter_tensor(flat, inp.npu())
dist.reduce_scatter_tensor(stacked, inp.view(WORLD, 4).npu())
for got, form in ((listed, "list"), (flat, "flat"), (stacked, "stacked")):
    same(got, gloo_sum(inp)[4 * RANK:4 * RANK + 4], f"reduce_scatter {form} form")
backend = next(iter(process_group._groups))                  # this job's one ProcessGroupHCCL, called directly
out = torch.zeros(WORLD * 3).npu()
backend._allgather_base(out, torch.full((3,), float(RANK)).npu()).wait()
same(out, torch.arange(WORLD).repeat_interleave(3).float(), "backend._allgather_base")
out = torch.zeros(2).npu()
backend._reduce_scatter_base(out, torch.ones(2 * WORLD).npu(), dist.ReduceScatterOptions()).wait()
same(out, torch.full((2,), float(WORLD)), "backend._reduce_scatter_base")

# -- point to point with the own rank ------------------------------------------------------------------------------
mine_in, mine_out = torch.arange(5.).npu() + RANK, torch.zeros(5).npu()
for w in (dist.isend(mine_in, RANK), dist.irecv(mine_out, RANK)):
    w.wait()
same(mine_out, mine_in, "isend/irecv to the own rank")
a, b = torch.full((3,), RANK + 0.5).npu(), torch.zeros(3).npu()
c, d = torch.full((2,), float(RANK)).npu(), torch.zeros(2).npu()
works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, b, RANK), dist.P2POp(dist.isend, a, RANK),
                                dist.P2POp(dist.isend, c, NXT), dist.P2POp(dist.irecv, d, PRV)])
for w in works:
    w.wait()
same(b, a, "batch_isend_irecv to the own rank")
same(d, torch.full((2,), float(PRV)), "batch_isend_irecv with neighbours")

# -- gather on the root warns that it is an all_gather, as torch_npu does -------------------------------------------
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    got = [torch.zeros(2).npu() for _ in range(WORLD)] if RANK == 0 else None
    dist.gather(torch.full((2,), float(RANK)).npu(), got, dst=0)
if RANK == 0:
    assert any("Implemented with allgather instead" in str(w.message) for w in seen), [str(w.message) for w in seen]
    same(torch.stack([g.cpu() for g in got]), torch.arange(WORLD).float()[:, None].expand(WORLD, 2), "gather")

# -- argument mistakes: ProcessGroupHCCL's exception types and texts -----------------------------------------------
refused(lambda: dist.all_reduce(torch.rand(2, 3).npu().T), RuntimeError, "Tensors must be contiguous",
        "ERR02002 DIST invalid type")
refused(lambda: dist.broadcast(torch.rand(4, 2).npu()[:, 0], 0), RuntimeError, "Tensors must be contiguous")
refused(lambda: dist.all_reduce(torch.ones(2, dtype=torch.float64).npu()), RuntimeError,
        "HCCL allreduce: Unsupported data type at::kDouble", "ERR02007 DIST feature not supported")
refused(lambda: dist.reduce_scatter_tensor(torch.zeros(1, dtype=torch.uint8).npu(),
                                           torch.zeros(WORLD, dtype=torch.uint8).npu()), RuntimeError,
        "HCCL _reduce_scatter_base: Unsupported data type at::kByte/at::kBool")
refused(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32).npu(), op=dist.ReduceOp.BXOR), RuntimeError,
        "Cannot use ReduceOp.BXOR with HCCL")
refused(lambda: dist.all_to_all_single(torch.zeros(WORLD).npu(), torch.zeros(WORLD).npu(), [1] * WORLD, [1, 1, 1, 1]),
        RuntimeError, "Number of tensor splits not equal to group size", "ERR02002")
refused(lambda: dist.all_to_all_single(torch.zeros(WORLD).npu(), torch.zeros(WORLD).npu(), [1] * WORLD,
                                       [WORLD] + [0] * (WORLD - 2) + [1]), RuntimeError,
        "Split sizes doesn't match total dim 0 size")
refused(lambda: dist.all_to_all_single(torch.zeros(WORLD + 1).npu(), torch.zeros(WORLD + 1).npu()), RuntimeError,
        "Tensor's dim 0 does not divide equally across group size")
refused(lambda: dist.all_to_all_single(torch.zeros(WORLD).npu(), torch.zeros(WORLD + 1).npu()), RuntimeError,
        "Tensors are not equal in size or data type")
refused(lambda: backend.gather([[torch.zeros(1).npu()]], [torch.zeros(1).npu()], dist.GatherOptions()), ValueError,
        "ProcessGroupHCCL::gather: ", "Incorrect output list size 1. Output list size should be" if RANK == 0 else
        "requires empty output on non-root")
refused(lambda: backend.scatter([torch.zeros(1).npu()], [[torch.zeros(1).npu()] * (WORLD + 1)], dist.ScatterOptions()),
        ValueError, "ProcessGroupHCCL::scatter: ", "Incorrect input list size" if RANK == 0 else
        "requires empty input on non-root")
refused(lambda: backend._allgather_base(torch.zeros(WORLD).npu(), torch.zeros(2).npu()), RuntimeError,
        "output tensor size must be equal to world_size times input tensor size")
refused(lambda: backend._reduce_scatter_base(torch.zeros(1).npu(), torch.zeros(WORLD, dtype=torch.int32).npu(),
                                             dist.ReduceScatterOptions()), RuntimeError,
        "input tensor must be the same type as the output tensor.")

# reduce_scatter with output and inputs on different devices (Ascend's error_size.py): where npu is a device of its
# own, as torch_npu writes it; else the same check on the devices torch has (cpu and meta)
if checks.npu_is_real() and torch.npu.device_count() > 1:
    mode = "npu device"
    output = torch.zeros(4, device=f"npu:{RANK}")
    inputs = [torch.zeros(4, device=f"npu:{NXT}") for _ in range(WORLD)]
    refused(lambda: dist.reduce_scatter(output, inputs), RuntimeError,
            "Corresponding input/output tensors to reduce_scatter must all reside on the same device")
    refused(lambda: dist.all_gather([torch.zeros(4, device=f"npu:{NXT}") for _ in range(WORLD)], output),
            RuntimeError, "Corresponding input/output tensors to scatter/gather must all reside on the same device")
    refused(lambda: dist.all_gather([torch.zeros(4).npu() for _ in range(WORLD)], torch.zeros(4)), RuntimeError,
            "Tensors must be NPU and dense")                  # the input is checked first, as ProcessGroupHCCL does
else:
    mode = "npu names CPU tensors"
    refused(lambda: checks.reduce_scatter_devices([torch.zeros(4, device="meta")], torch.zeros(4)), RuntimeError,
            "Corresponding input/output tensors to reduce_scatter must all reside on the same device")

dist.barrier()
print(f"SEMANTICS OK ({mode}) on rank {RANK}", flush=True)
dist.destroy_process_group()
