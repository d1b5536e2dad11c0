"""torch on simulated cards, measured (not a test): all_reduce through "hccl" against gloo, and the cost of
computing on ``npu`` tensors.

    launch --nproc 4 bench/torch_bench.py [--sizes 1K,16M] [--iters N]
    python bench/torch_bench.py --mlp [--iters N]

All-reduce: every rank runs the same float32 all_reduce on an ``npu`` tensor through the default ("hccl") group
and on a CPU tensor through a gloo group over the same ranks, alternating, after a warm-up; rank 0 prints the
median time per call and the bus bandwidth (nccl-tests' definition, 2(n-1)/n × bytes / time) for each. The hccl
figure includes what a torch user pays: the copy of the tensor into card memory and back around npusim's
collective.

``--mlp``: one process trains a small MLP (forward, backward, SGD step) on CPU tensors and on ``npu`` tensors and
prints steps/s, the ATen operators per step, and the cost each operator pays on ``npu`` (the dispatch through
npusim's Python backend). Reported, never asserted.
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


def mlp_step_rate(device: str, iters: int):
    """(training steps per second, the step function) of a small MLP (batch 32, 64 -> 128 -> 128 -> 10) on
    ``device``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64).to(device), torch.randint(0, 10, (32,)).to(device)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    for _ in range(5):
        step()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    return iters / (time.perf_counter() - t0), step


def aten_ops_per_step(step) -> int:
    """How many ATen operators one step dispatches (counted below autograd, as a backend sees them)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))
    with Count():
        step()
    return Count.n


def bench_mlp(iters: int) -> None:
    torch.set_num_threads(1)            # the same kernels either way: measure the dispatch, not thread contention
    cpu_rate = npu_rate = 0.0
    for _ in range(3):                  # best of three, alternating, so a busy host hurts both alike
        rate, cpu_step = mlp_step_rate("cpu", iters)
        cpu_rate = max(cpu_rate, rate)
        npu_rate = max(npu_rate, mlp_step_rate("npu", iters)[0])
    ops = aten_ops_per_step(cpu_step)
    per_op = (1 / npu_rate - 1 / cpu_rate) / ops
    print(f"MLP 64-128-128-10, batch 32, forward + backward + SGD step, 1 thread (best of 3 x {iters} steps, "
          f"{ops} ATen operators each)")
    print(f"  cpu tensors: {cpu_rate:8.0f} steps/s  ({cpu_rate * ops:8.0f} ops/s)")
    print(f"  npu tensors: {npu_rate:8.0f} steps/s  ({npu_rate * ops:8.0f} ops/s)  "
          f"{cpu_rate / npu_rate:.1f}x slower, +{per_op * 1e6:.0f} us per operator")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1K,16M")
    p.add_argument("--iters", type=int, default=0, help="calls per size and backend (default: 50 below 1 MiB, else 10)")
    p.add_argument("--mlp", action="store_true", help="measure npu-tensor compute in this process instead")
    a = p.parse_args()
    if a.mlp:
        bench_mlp(a.iters or 300)
        return
    dist.init_process_group("hccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.npu.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    gloo = dist.new_group(backend="gloo")
    rows = []
    for size in (parse_size(s) for s in a.sizes.split(",")):
        iters = a.iters or (50 if size < (1 << 20) else 10)
        x_npu, x_cpu = torch.ones(size // 4, device="npu"), torch.ones(size // 4)
        t_hccl = timed(lambda x=x_npu: dist.all_reduce(x), iters)
        t_gloo = timed(lambda x=x_cpu: dist.all_reduce(x, group=gloo), iters)
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
