"""torch.distributed (gloo, CPU) peer of hccl-test: all_reduce / broadcast / all_gather / reduce_scatter, fp32.

    torchrun --nproc-per-node 8 bench/peers/gloo_allreduce.py all_reduce -b 1K -e 64M -f 4 -n 20 -w 5
    torchrun --nproc-per-node 8 bench/peers/gloo_allreduce.py all_reduce --first-only

Rank 0 prints one ``PEER_RESULT {json}`` line (rows as hccl-test's, see common.py); with
``--first-only`` it prints ``FIRST_COLLECTIVE <unix time>`` once its first all_reduce completed.
torch's all_reduce and broadcast work in place (gloo has no out-of-place form); all_gather fills a
list of per-rank tensors; reduce_scatter is ``reduce_scatter_tensor`` (out of place).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from common import emit, first_collective_mark, layout, median_time, parser, row, sizes  # noqa: E402


def pattern(count: int, rank: int) -> torch.Tensor:
    return ((torch.arange(count, dtype=torch.int64) * 7 + 31 * rank) % 101 + 1).to(torch.float32)


def bench_one(collective: str, nbytes: int, ns, rank: int, n: int, timed: bool = True) -> dict | None:
    """One row; ``timed=False``: only the ``ns.warmup`` calls (the sweep's warm-up, as nccl-tests' TimeTest)."""
    count, size = layout(collective, nbytes, n)
    if collective == "reduce_scatter":
        count *= n                               # the input holds every rank's block
    x = pattern(count, rank)
    if collective == "all_reduce":
        def call():
            dist.all_reduce(x)
    elif collective == "broadcast":
        def call():
            dist.broadcast(x, 0)
    elif collective == "reduce_scatter":
        out = torch.empty(count // n, dtype=torch.float32)

        def call():
            dist.reduce_scatter_tensor(out, x)
    else:
        outs = [torch.empty(count, dtype=torch.float32) for _ in range(n)]

        def call():
            dist.all_gather(outs, x)
    for _ in range(ns.warmup):
        call()
    if not timed:
        return None
    dist.barrier()
    med = median_time(call, lambda: None, ns.iters)   # gloo calls block until complete on CPU
    # check once from fresh inputs
    x.copy_(pattern(count, rank))
    call()
    if collective == "all_reduce":
        want = sum(pattern(count, r) for r in range(n))
        wrong = int((x != want).sum())
    elif collective == "broadcast":
        wrong = int((x != pattern(count, 0)).sum())
    elif collective == "reduce_scatter":
        block = count // n
        want = sum(pattern(count, r) for r in range(n))[rank * block: (rank + 1) * block]
        wrong = int((out != want).sum())
    else:
        wrong = sum(int((outs[r] != pattern(count, r)).sum()) for r in range(n))
    stats = torch.tensor([med], dtype=torch.float64)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    bad = torch.tensor([wrong], dtype=torch.int64)
    dist.all_reduce(bad)
    return row(collective, n, size, float(stats[0]), int(bad[0]))


def main() -> None:
    ns = parser("gloo_allreduce").parse_args()
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    if ns.first_only:
        t = torch.ones(256)
        dist.all_reduce(t)
        if rank == 0:
            first_collective_mark()
        dist.destroy_process_group()
        return
    dist.barrier()
    for s in (max(sizes(ns)), min(sizes(ns))):          # nccl-tests' TimeTest: warm up at both ends first
        bench_one(ns.collective, s, ns, rank, n, timed=False)
    rows = [bench_one(ns.collective, s, ns, rank, n) for s in sizes(ns)]
    if rank == 0:
        emit({"peer": "gloo", "collective": ns.collective, "nranks": n, "rows": rows,
              "torch": torch.__version__})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
