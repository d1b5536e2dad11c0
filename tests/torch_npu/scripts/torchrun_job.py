"""A torchrun-started job (no launch): rank 0 hosts the cards, every rank reaches them, results as gloo's.

    torchrun --nproc-per-node 2 torchrun_job.py
"""
import os

import torch
import torch.distributed as dist

import torch_npu  # noqa: F401

torch.npu.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("hccl")
rank, world = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
y = torch.arange(6, dtype=torch.float32) * (rank + 1)
x = y.clone().npu()
dist.all_reduce(x)
dist.all_reduce(y, group=gloo)
assert torch.equal(x.cpu(), y), (x, y)
outs = [torch.zeros(2, dtype=torch.int64).npu() for _ in range(world)]
dist.all_gather(outs, torch.tensor([rank, rank * 10]).npu())
assert [o.cpu().tolist() for o in outs] == [[r, r * 10] for r in range(world)], outs
objs = [None] * world
dist.all_gather_object(objs, {"rank": rank})              # on the current npu, as torch_npu moves them
assert objs == [{"rank": r} for r in range(world)], objs
dist.barrier()
print(f"rank {rank} of {world}: ok on card {torch.npu.current_device()} pid {os.getpid()}", flush=True)
dist.destroy_process_group()
