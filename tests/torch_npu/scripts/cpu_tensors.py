"""CPU tensors and the "hccl" backend, as torch_npu has them: refused by an "hccl" group with c10d's text, served
by gloo in a "cpu:gloo,npu:hccl" group or a gloo subgroup; object collectives and barrier keep working either way.
Results are checked against a gloo group over the same ranks. Prints "CPU OK (<backend>)".

    launch --nproc 2 tests/torch_npu/scripts/cpu_tensors.py [hccl | cpu:gloo,npu:hccl]
"""

import os
import sys

import torch
import torch.distributed as dist

import torch_npu  # noqa: F401

BACKEND = sys.argv[1] if len(sys.argv) > 1 else "hccl"
dist.init_process_group(BACKEND)
RANK, WORLD = dist.get_rank(), dist.get_world_size()
torch.npu.set_device(int(os.environ["LOCAL_RANK"]))
GLOO = dist.new_group(backend="gloo")
PEER = (RANK + 1) % WORLD
NO_BACKEND = "No backend type associated with device type cpu"


def refused(what, fn, exc, text, exact=False):
    try:
        fn()
    except exc as e:
        got = str(e)
        ok = type(e) is exc and (got == text if exact else text in got)
        assert ok, f"rank {RANK}: {what}: {type(e).__name__}: {got!r}, expected {exc.__name__}: {text!r}"
    else:
        raise AssertionError(f"rank {RANK}: {what}: accepted, expected {exc.__name__}: {text!r}")


def c(*shape):
    return torch.ones(*shape)


# every collective and point-to-point call with CPU tensors only
CPU_CALLS = {
    "all_reduce": lambda: dist.all_reduce(c(4)),
    "reduce": lambda: dist.reduce(c(4), dst=0),
    "broadcast": lambda: dist.broadcast(c(4), src=0),
    "all_gather": lambda: dist.all_gather([c(2) for _ in range(WORLD)], c(2)),
    "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(c(2 * WORLD), c(2)),
    "gather": lambda: dist.gather(c(2), [c(2) for _ in range(WORLD)] if RANK == 0 else None, dst=0),
    "scatter": lambda: dist.scatter(c(2), [c(2) for _ in range(WORLD)] if RANK == 0 else None, src=0),
    "reduce_scatter": lambda: dist.reduce_scatter(c(2), [c(2) for _ in range(WORLD)]),
    "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(c(2), c(2 * WORLD)),
    "all_to_all": lambda: dist.all_to_all([c(1) for _ in range(WORLD)], [c(1) for _ in range(WORLD)]),
    "all_to_all_single": lambda: dist.all_to_all_single(c(WORLD), c(WORLD)),
    "all_to_all_single splits": lambda: dist.all_to_all_single(c(WORLD), c(WORLD), [1] * WORLD, [1] * WORLD),
    "send": lambda: dist.send(c(3), PEER),
    "recv": lambda: dist.recv(c(3), PEER),
    "isend": lambda: dist.isend(c(3), PEER),
    "irecv": lambda: dist.irecv(c(3), PEER),
    "batch_isend_irecv": lambda: dist.batch_isend_irecv([dist.P2POp(dist.isend, c(3), PEER),
                                                         dist.P2POp(dist.irecv, c(3), PEER)]),
}

if BACKEND == "hccl":
    assert dist.group.WORLD._device_types == [torch.device("npu")], dist.group.WORLD._device_types
    for what, call in CPU_CALLS.items():
        refused(what, call, RuntimeError, NO_BACKEND, exact=True)
    refused("_get_backend(cpu)", lambda: dist.group.WORLD._get_backend(torch.device("cpu")), RuntimeError, NO_BACKEND)
    # a CPU tensor next to npu ones reaches the backend, which refuses it as ProcessGroupHCCL does
    refused("all_gather npu outputs, cpu input", lambda: dist.all_gather([c(2).npu() for _ in range(WORLD)], c(2)),
            RuntimeError, "Tensors must be NPU and dense")
    refused("reduce_scatter cpu output, npu inputs",
            lambda: dist.reduce_scatter(c(2), [c(2).npu() for _ in range(WORLD)]), RuntimeError,
            "Tensors must be NPU and dense")
    # the CPU tensors go to a gloo subgroup instead, as torch_npu users do
    t = torch.full((4,), float(RANK + 1))
    dist.all_reduce(t, group=GLOO)
    assert torch.equal(t, torch.full((4,), float(sum(range(1, WORLD + 1))))), t
else:
    assert set(dist.group.WORLD._device_types) == {torch.device("cpu"), torch.device("npu")}
    # "cpu:gloo,npu:hccl": CPU tensors go to the group's gloo, npu tensors to hccl; both match the gloo group
    for dev in ("cpu", "npu"):
        mine = torch.arange(6, dtype=torch.float32).to(dev) * (RANK + 1)
        dist.all_reduce(mine)
        gathered = [torch.zeros(3).to(dev) for _ in range(WORLD)]
        dist.all_gather(gathered, torch.full((3,), float(RANK)).to(dev))
        ref = torch.arange(6, dtype=torch.float32) * (RANK + 1)
        dist.all_reduce(ref, group=GLOO)
        assert mine.device.type == dev and torch.equal(mine.cpu(), ref), (dev, mine, ref)
        assert [g.cpu().tolist() for g in gathered] == [[float(r)] * 3 for r in range(WORLD)], gathered
    got = torch.zeros(3)
    if RANK == 0:
        dist.send(torch.tensor([1.0, 2.0, 3.0]), PEER)
    elif RANK == 1:
        dist.recv(got, 0)
        assert got.tolist() == [1.0, 2.0, 3.0], got

# object collectives (torch moves them to the current npu device for an hccl group, keeps them on the CPU for
# "cpu:gloo,npu:hccl"), each against the gloo group
for group in (None, GLOO):
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, {"rank": RANK, "items": list(range(RANK + 2))}, group=group)
    assert gathered == [{"rank": r, "items": list(range(r + 2))} for r in range(WORLD)], gathered
    objs = [("from", 0), 3.5, None] if RANK == 0 else [None, None, None]
    dist.broadcast_object_list(objs, src=0, group=group)
    assert objs == [("from", 0), 3.5, None], objs
    out = [None] * WORLD if RANK == 1 else None
    dist.gather_object(f"rank{RANK}" * (RANK + 1), out, dst=1, group=group)
    if RANK == 1:
        assert out == [f"rank{r}" * (r + 1) for r in range(WORLD)], out
    received = [None]
    dist.scatter_object_list(received, [{"to": r} for r in range(WORLD)] if RANK == 0 else None, src=0, group=group)
    assert received == [{"to": RANK}], received
    if RANK == 0:
        dist.send_object_list([{"p2p": True}, "x" * 100], dst=1, group=group)
    elif RANK == 1:
        box = [None, None]
        dist.recv_object_list(box, src=0, group=group)
        assert box == [{"p2p": True}, "x" * 100], box
    dist.barrier(group=group)

dist.barrier()
print(f"CPU OK ({BACKEND}) on rank {RANK}", flush=True)
dist.destroy_process_group()
