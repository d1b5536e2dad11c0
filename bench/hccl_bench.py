"""all_reduce benchmark (not a test), nccl-tests style: 8 cards driven from one process.

    python bench/hccl_bench.py [-n 20] [-w 3] [-b 1K] [-e 64M] [--algos mesh,ring,H-D_R,auto] [--local]

For each algorithm (``HCCL_ALGO`` is read at communicator init, so every algorithm gets its own
``comm_init_all``) and each size from ``-b`` to ``-e`` (×4 per step), one iteration is: enqueue an
out-of-place fp32 SUM all_reduce on all ranks, then synchronize all ranks. The reported time is the
median over ``-n`` iterations after ``-w`` warm-ups; ``algbw = size / time`` and
``busbw = algbw × 2(n−1)/n`` as in nccl-tests. ``#wrong`` counts ranks whose result differs from
numpy after the timed runs. The ``chosen`` column is the algorithm the runtime picks for that size:
``level1`` settings (H-D_R) only apply across nodes (or between the HCCS groups of a 2x4 node), so
on one full-mesh node that row shows the automatic one-node choice.

Cards are Ray actors (one process each) by default; ``--local`` runs them inside this process.
``--topology 2x4`` simulates a 910-style node (two HCCS groups of 4), where all_reduce runs
hierarchically with H-D_R between the groups.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import hccl  # noqa: E402
import rt  # noqa: E402
from hccl.algos import choose  # noqa: E402

ALGOS = {"mesh": "level0:fullmesh", "ring": "level0:ring", "H-D_R": "level0:NA;level1:H-D_R", "auto": None}


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def human(nbytes: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes // size} {unit}"
    return f"{nbytes} B"


def make_comms(cards: int, algo_text: str | None) -> list:
    if algo_text is None:
        os.environ.pop("HCCL_ALGO", None)
    else:
        os.environ["HCCL_ALGO"] = algo_text
    try:
        return hccl.comm_init_all(list(range(cards)))
    finally:
        os.environ.pop("HCCL_ALGO", None)


def bench_size(comms, nbytes: int, warmup: int, iters: int) -> tuple[float, int]:
    """(median seconds per all_reduce, ranks with a wrong result)."""
    n = len(comms)
    count = nbytes // 4
    sends, recvs = [], []
    for r, c in enumerate(comms):
        rt.set_context(c.ctx)
        sends.append(rt.Tensor.from_numpy(np.full(count, r + 1, np.float32)))
        recvs.append(rt.empty(count, np.float32))
    code = hccl.HCCL_DATA_TYPE_FP32

    def once():
        for c, s, d in zip(comms, sends, recvs):
            hccl.all_reduce(s.ptr, d.ptr, count, code, hccl.HCCL_REDUCE_SUM, c)
        for c in comms:
            c.synchronize()

    for _ in range(warmup):
        once()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    want = np.float32(n * (n + 1) / 2)
    wrong = sum(1 for d in recvs if not np.all(d.numpy() == want))
    for t in sends + recvs:
        t.free()
    return statistics.median(times), wrong


def main() -> int:
    ap = argparse.ArgumentParser(description="HCCL all_reduce benchmark (nccl-tests columns)")
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("-w", "--warmup", type=int, default=3)
    ap.add_argument("-b", "--min-bytes", default="1K")
    ap.add_argument("-e", "--max-bytes", default="64M")
    ap.add_argument("-f", "--factor", type=int, default=4)
    ap.add_argument("--algos", default="mesh,ring,H-D_R", help=f"comma list of {list(ALGOS)}")
    ap.add_argument("--cards", type=int, default=8)
    ap.add_argument("--local", action="store_true", help="in-process cards instead of Ray card actors")
    ap.add_argument("--topology", choices=["fullmesh", "2x4"], default=None,
                    help="override the config's node topology; 2x4 runs hierarchical (mesh in each group of 4, "
                         "H-D_R across the groups)")
    args = ap.parse_args()
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    unknown = [a for a in algos if a not in ALGOS]
    if unknown:
        ap.error(f"unknown algorithms {unknown} (known: {list(ALGOS)})")
    sizes = []
    size = parse_size(args.min_bytes)
    while size <= parse_size(args.max_bytes):
        sizes.append(size)
        size *= args.factor

    config = None
    if args.topology:
        config = os.path.join(tempfile.mkdtemp(prefix="hccl-bench-"), f"{args.topology}.toml")
        with open(config, "w") as f:
            f.write(f'[node]\ntopology = "{args.topology}"\n')
    try:
        rt.init(config, backend="local" if args.local else None)
    finally:
        if config:                      # read by rt.init; nothing of ours stays in /tmp
            shutil.rmtree(os.path.dirname(config), ignore_errors=True)
    try:
        cfg = rt.host.runtime.RUNTIME.cfg
        topology = cfg.topology
        # the same mesh→ring switch the card's HCCL extension applies (hccl/card/extension.py)
        limit = getattr(cfg, "ring_threshold_bytes", 0)
        thresholds = {k: limit for k in ("all_reduce", "all_gather", "reduce_scatter")} if limit else {}
        n = args.cards
        print(f"# all_reduce, {n} cards ({'in-process' if args.local else 'Ray card actors'}, {topology}), "
              f"one host process, median of {args.iters} after {args.warmup} warm-ups")
        header = f"{'algo':>6} {'size':>9} {'count':>10} {'type':>5} {'redop':>5} {'chosen':>12} " \
                 f"{'time(us)':>10} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>6}"
        print(header)
        for algo in algos:
            comms = make_comms(n, ALGOS[algo])
            for nbytes in sizes:
                chosen, _ = choose("all_reduce", n, nbytes, topology=topology, hccl_algo=ALGOS[algo],
                                   thresholds=thresholds)
                sec, wrong = bench_size(comms, nbytes, args.warmup, args.iters)
                algbw = nbytes / sec / 1e9
                busbw = algbw * 2 * (n - 1) / n
                print(f"{algo:>6} {human(nbytes):>9} {nbytes // 4:>10} {'float':>5} {'sum':>5} {chosen:>12} "
                      f"{sec * 1e6:>10.1f} {algbw:>11.3f} {busbw:>11.3f} {wrong:>6}", flush=True)
            for c in comms:
                hccl.comm_destroy(c)
    finally:
        rt.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
