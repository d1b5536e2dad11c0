"""Ranks started the way torch_npu's own tests start them: a ``torch.multiprocessing`` spawn ``Process`` per rank,
``init_process_group("hccl", init_method=..., world_size=..., rank=...)`` in each, results handed back through a
queue, the parent joining the ranks in order (rank 0 first, while the others are zombies by then). Also sets
``HCCL_ALGO`` as torch_npu's all_to_all tests do. Prints "MP OK <seconds>" once every rank has exited 0.

    python mp_ranks.py WORLD INIT_METHOD        # INIT_METHOD: tcp://127.0.0.1:PORT, or env (MASTER_ADDR/PORT)
"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_npu


def run_rank(rank, world, init_method, queue):
    os.environ["HCCL_WHITELIST_DISABLE"] = "1"
    os.environ["HCCL_ALGO"] = "level0:NA;level1:fullmesh"
    torch_npu.npu.set_device(rank)
    if init_method == "env":
        dist.init_process_group(backend="hccl", world_size=world, rank=rank)
    else:
        dist.init_process_group(backend="hccl", init_method=init_method, world_size=world, rank=rank)
    x = (torch.arange(4, dtype=torch.float32) + rank).npu()
    dist.all_reduce(x)
    outs = [torch.zeros(2, dtype=torch.int32).npu() for _ in range(world)]
    dist.all_gather(outs, torch.tensor([rank, -rank], dtype=torch.int32).npu())
    # plain lists: a CPU tensor in a queue shares its storage by fd through this process, which may have exited
    # by the time the parent unpickles it (rank 0 does not wait)
    queue.put((rank, x.cpu().tolist(), torch.stack([o.cpu() for o in outs]).tolist()))
    if rank != 0:
        # still running when rank 0's exit hook looks, exits while it waits: then a zombie until the parent
        # joins it, which is after rank 0
        time.sleep(1.0)


def main():
    world, init_method = int(sys.argv[1]), sys.argv[2]
    if init_method.startswith("env:"):
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", init_method[4:]
        init_method = "env"
    t0 = time.monotonic()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue(world)
    procs = []
    for rank in range(world):
        p = ctx.Process(target=run_rank, args=(rank, world, init_method, queue))
        p.start()
        procs.append(p)
    results = sorted(queue.get(timeout=120) for _ in range(world))
    for p in procs:                  # rank 0 first
        p.join()
        assert p.exitcode == 0, f"rank {procs.index(p)} exited with {p.exitcode}"
    expect = sum(torch.arange(4, dtype=torch.float32) + r for r in range(world))
    gathered = torch.tensor([[r, -r] for r in range(world)], dtype=torch.int32)
    for rank, x, outs in results:
        assert torch.equal(torch.tensor(x), expect), (rank, x, expect)
        assert torch.equal(torch.tensor(outs, dtype=torch.int32), gathered), (rank, outs)
    print(f"MP OK {time.monotonic() - t0:.1f}", flush=True)


if __name__ == "__main__":
    main()
