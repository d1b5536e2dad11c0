"""Shared by the peer benchmark scripts: the size sweep, the timing rule and the row format of hccl-test.

Timing is hccl-test's: every call is issued and completed (blocking) on every rank, timed with the
host clock; a rank's figure is the median of its timed calls; the reported time is the max over ranks.
Patterns are small integers, so a SUM is exact whatever the order and ``wrong`` is a real count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

BUSBW = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0,
         "reduce_scatter": lambda n: (n - 1) / n}


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    return int(float(t[:-1]) * units[t[-1]]) if t[-1:] in units else int(t)


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("collective", choices=sorted(BUSBW))
    p.add_argument("-b", "--minbytes", type=parse_size, default=1024)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=64 << 20)
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("--first-only", action="store_true",
                   help="one 1 KiB all_reduce, print 'FIRST_COLLECTIVE <unix time>' on rank 0, exit")
    return p


def sizes(ns) -> list[int]:
    out, s = [], ns.minbytes
    while s <= ns.maxbytes:
        out.append(s)
        s *= ns.stepfactor
    return out


def layout(collective: str, nbytes: int, n: int) -> tuple[int, int]:
    """(elements per rank's block, reported size in bytes) for fp32, as hccl-test / nccl-tests: a block is the
    whole input, except for all_gather (its input) and reduce_scatter (its output), where the size counts
    every rank's block."""
    count = nbytes // 4
    if collective in ("all_gather", "reduce_scatter"):
        per = count // n
        return per, per * n * 4
    return count, count * 4


def median_time(call, sync, iters: int) -> float:
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def row(collective: str, n: int, size: int, seconds: float, wrong: int) -> dict:
    algbw = size / seconds / 1e9
    return {"size": size, "time_us": seconds * 1e6, "algbw": algbw, "busbw": algbw * BUSBW[collective](n),
            "wrong": wrong}


def emit(doc: dict) -> None:
    """One line the runner picks out of the launcher's output."""
    print("PEER_RESULT " + json.dumps(doc), flush=True)


def first_collective_mark() -> None:
    print(f"FIRST_COLLECTIVE {time.time():.6f}", flush=True)
