"""torch.distributed all_reduce through npusim's "hccl" backend against gloo, in the same job (not a test).

    launch --nproc 4 bench/torch_bench.py [--sizes 1K,16M] [--iters N]

Every rank runs the same float32 all_reduce on the default ("hccl") group and on a gloo group over the same
ranks, alternating, after a warm-up; rank 0 prints the median time per call and the bus bandwidth
(nccl-tests' definition, 2(n-1)/n × bytes / time) for each. Reported, never asserted. The hccl figure includes
what a torch user pays: the copy of the tensor into card memory and back around npusim's collective.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch_npu  # noqa: F401

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().rstrip("B")
    return int(float(text[:-1]) * UNITS[text[-1]]) if text[-1] in UNITS else int(text)


def timed(fn, iters: int) -> float:
    fn()
    fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1K,16M")
    p.add_argument("--iters", type=int, default=0, help="calls per size and backend (default: 50 below 1 MiB, else 10)")
    a = p.parse_args()
    dist.init_process_group("hccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.npu.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    gloo = dist.new_group(backend="gloo")
    rows = []
    for size in (parse_size(s) for s in a.sizes.split(",")):
        iters = a.iters or (50 if size < (1 << 20) else 10)
        x = torch.ones(size // 4)
        t_hccl = timed(lambda: dist.all_reduce(x), iters)
        t_gloo = timed(lambda: dist.all_reduce(x, group=gloo), iters)
        rows.append((size, t_hccl, t_gloo))
    if rank == 0:
        factor = 2 * (world - 1) / world
        print(f"all_reduce float32 sum, {world} ranks (median of {a.iters or '50/10'} calls)")
        print(f"{'size':>10} {'hccl time':>12} {'busbw GB/s':>11} {'gloo time':>12} {'busbw GB/s':>11}")
        for size, th, tg in rows:
            print(f"{size:>10} {th * 1e6:>10.0f}us {factor * size / th / 1e9:>11.3f} {tg * 1e6:>10.0f}us "
                  f"{factor * size / tg / 1e9:>11.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
