"""mpi4py + Open MPI peer of hccl-test: all_reduce / broadcast / all_gather / reduce_scatter, fp32 numpy buffers.

    mpirun --allow-run-as-root --oversubscribe -np 8 python bench/peers/mpi_allreduce.py all_reduce -b 1K -e 64M

Rank 0 prints one ``PEER_RESULT {json}`` line (rows as hccl-test's, see common.py). Out-of-place
``Allreduce(send, recv)``, ``Allgather`` and ``Reduce_scatter_block``; ``Bcast`` is in place by definition.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from common import emit, first_collective_mark, layout, median_time, parser, row, sizes  # noqa: E402


def pattern(count: int, rank: int) -> np.ndarray:
    return ((np.arange(count, dtype=np.int64) * 7 + 31 * rank) % 101 + 1).astype(np.float32)


def bench_one(comm, collective: str, nbytes: int, ns, timed: bool = True) -> dict | None:
    """One row; ``timed=False``: only the ``ns.warmup`` calls (the sweep's warm-up, as nccl-tests' TimeTest)."""
    rank, n = comm.rank, comm.size
    count, size = layout(collective, nbytes, n)
    if collective == "reduce_scatter":
        count *= n                               # the input holds every rank's block
    x = pattern(count, rank)
    if collective == "all_reduce":
        out = np.zeros(count, np.float32)

        def call():
            comm.Allreduce(x, out, op=MPI.SUM)
    elif collective == "broadcast":
        out = x

        def call():
            comm.Bcast(x, root=0)
    elif collective == "reduce_scatter":
        out = np.zeros(count // n, np.float32)

        def call():
            comm.Reduce_scatter_block(x, out, op=MPI.SUM)
    else:
        out = np.zeros(count * n, np.float32)

        def call():
            comm.Allgather(x, out)
    for _ in range(ns.warmup):
        call()
    if not timed:
        return None
    comm.Barrier()
    med = median_time(call, lambda: None, ns.iters)
    x[:] = pattern(count, rank)
    if out is not x:
        out[:] = 0
    call()
    if collective == "all_reduce":
        want = sum(pattern(count, r) for r in range(n))
    elif collective == "broadcast":
        want = pattern(count, 0)
    elif collective == "reduce_scatter":
        block = count // n
        want = sum(pattern(count, r) for r in range(n))[rank * block: (rank + 1) * block]
    else:
        want = np.concatenate([pattern(count, r) for r in range(n)])
    wrong = int(np.count_nonzero(out != want))
    worst = comm.allreduce(med, op=MPI.MAX)
    bad = comm.allreduce(wrong, op=MPI.SUM)
    return row(collective, n, size, worst, bad)


def main() -> None:
    ns = parser("mpi_allreduce").parse_args()
    comm = MPI.COMM_WORLD
    if ns.first_only:
        a = np.ones(256, np.float32)
        b = np.empty_like(a)
        comm.Allreduce(a, b)
        if comm.rank == 0:
            first_collective_mark()
        return
    comm.Barrier()
    for s in (max(sizes(ns)), min(sizes(ns))):          # nccl-tests' TimeTest: warm up at both ends first
        bench_one(comm, ns.collective, s, ns, timed=False)
    rows = [bench_one(comm, ns.collective, s, ns) for s in sizes(ns)]
    if comm.rank == 0:
        emit({"peer": "mpi", "collective": ns.collective, "nranks": comm.size, "rows": rows,
              "mpi": MPI.Get_library_version().splitlines()[0].rstrip("\0")})


if __name__ == "__main__":
    main()
