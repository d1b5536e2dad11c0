"""The flight recorder's cost in one job: ``launch --nproc 8 bench/peers/trace_paired.py [--bytes 1024 ...]``.

Every rank times blocks of ``--block`` calls (fp32 all_reduce + synchronize_stream), the recorder off and on in
turn: the same processes, caches and neighbours, and every rank switches at the same call, so the load of the
machine falls on both alike (separate runs, as ``trace_overhead.py`` alternates them, differ by more than the
recorder costs). Switching is what ``NPUSIM_TRACE_BUFFER_SIZE=0`` does at start-up: the recorder stops watching
and the seam (``rt/host/seam.py``) is told, so an unobserved call makes one attribute check. The first call after a
switch is not timed. Each rank prints ``TRACE_PAIRED {json}``: the medians over blocks of wall and CPU time per
call, off and on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import hccl
import rt
from rt.diag.recorder import RECORDER
from rt.host.seam import SEAM


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=int, default=1024, help="message size per rank")
    p.add_argument("--block", type=int, default=25, help="calls per timed block")
    p.add_argument("--blocks", type=int, default=60, help="blocks per mode")
    p.add_argument("--warmup", type=int, default=200)
    ns = p.parse_args()
    comm = hccl.init()
    count = max(ns.bytes // 4, 1)
    src = rt.Tensor.from_numpy(np.ones(count, np.float32))
    dst = rt.empty((count,), np.float32)
    fp32, total = hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM

    def call():
        hccl.all_reduce(src.ptr, dst.ptr, count, fp32, total, comm)
        rt.synchronize_stream(None)

    for _ in range(ns.warmup):
        call()
    if not RECORDER.watching:
        raise SystemExit("the flight recorder is off (NPUSIM_TRACE_BUFFER_SIZE=0): nothing to compare")
    cpu, wall = {False: [], True: []}, {False: [], True: []}
    try:
        for _ in range(ns.blocks):
            for on in (False, True):
                RECORDER.watching = on
                SEAM.refresh()
                call()
                c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
                for _ in range(ns.block):
                    call()
                cpu[on].append((time.thread_time_ns() - c0) / ns.block / 1e3)
                wall[on].append((time.perf_counter_ns() - w0) / ns.block / 1e3)
    finally:
        RECORDER.watching = True
        SEAM.refresh()
    if not np.all(dst.numpy() == comm.size):
        raise SystemExit(f"rank {comm.rank}: wrong result")
    med = statistics.median
    print("TRACE_PAIRED " + json.dumps({"rank": comm.rank, "bytes": ns.bytes, "calls": ns.block * ns.blocks,
                                        "wall_off_us": med(wall[False]), "wall_on_us": med(wall[True]),
                                        "cpu_off_us": med(cpu[False]), "cpu_on_us": med(cpu[True])}), flush=True)


if __name__ == "__main__":
    main()
