"""Rank body of ``bench/scale.py``: under ``launch --nnodes K --nproc N``, rank 0 prints

    FIRST_COLLECTIVE <unix time>       once its first 1 KiB fp32 all_reduce has completed
    SCALE_RESULT {json}                the 1 KiB all_reduce time (median over ranks' medians is not known to
                                       one rank: rank 0's median and the max over ranks, gathered), the calls
                                       all ranks finished on the host path and handed to their cards, the
                                       CPU time of all rank processes per timed call (not their cards'), and
                                       with --big the result of one 64 MiB all_reduce checked against its formula

Every rank's input is a pattern of small integers, so the SUM is exact and a wrong element is a real error.
After the timed all_reduces every rank passes a barrier. Calls run on a stream of the rank's own, waited for
with ``synchronize_stream`` as HCCL's samples do (``--sync device``: ``synchronize_device``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import hccl
import rt


def pattern(count: int, rank: int) -> np.ndarray:
    return ((np.arange(count, dtype=np.int64) * 7 + 31 * rank) % 101 + 1).astype(np.float32)


def _wrong(got: np.ndarray, n: int, chunk: int = 1 << 20) -> int:
    """Elements of the all_reduced pattern that differ from its sum over ranks, checked in chunks (a rank must
    not hold n patterns at once: 64 ranks x 64 MiB would not fit). Element i of rank k's pattern is
    (7i + 31k) % 101 + 1, so the sum depends only on 7i % 101: one table of 101 sums."""
    residue = np.arange(101)
    table = sum(((residue + 31 * k) % 101 + 1) for k in range(n)).astype(np.float64)
    wrong = 0
    for start in range(0, got.size, chunk):
        i = np.arange(start, min(start + chunk, got.size), dtype=np.int64)
        wrong += int(np.count_nonzero(got[start:start + i.size] != table[(i * 7) % 101]))
    return wrong


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--big", type=int, default=0, help="bytes of one checked all_reduce (0: none)")
    p.add_argument("--sync", choices=("stream", "device"), default="stream",
                   help="wait for each call with synchronize_stream on the call's stream (HCCL's samples: "
                        "aclrtSynchronizeStream) or with synchronize_device")
    ns = p.parse_args()
    comm = hccl.init()
    r, n = comm.rank, comm.size
    stream = rt.create_stream()

    def sync():
        if ns.sync == "stream":
            rt.synchronize_stream(stream)
        else:
            rt.synchronize_device()
    t = rt.Tensor.from_numpy(np.ones(256, np.float32))
    comm.all_reduce(t, stream=stream)
    sync()
    if r == 0:
        print(f"FIRST_COLLECTIVE {time.time():.6f}", flush=True)
    assert float(t.numpy()[0]) == n, (t.numpy()[0], n)
    times = []
    for i in range(ns.iters + 5):
        if i == 5:
            cpu0 = time.process_time()
        t0 = time.perf_counter()
        comm.all_reduce(t, stream=stream)
        sync()
        if i >= 5:
            times.append(time.perf_counter() - t0)
    cpu = (time.process_time() - cpu0) / ns.iters    # this rank's process, per call (its card's not counted)
    comm.barrier(stream=stream)                 # every rank got here: the barrier across all nodes completes
    sync()
    mine = statistics.median(times)
    every = rt.Tensor.from_numpy(np.full(1, mine, np.float64))
    comm.all_reduce(every, op="max")
    host = comm.host_path()         # how many calls this rank finished itself, without its card
    on_host = rt.Tensor.from_numpy(np.array([host.done if host else 0, host.handed if host else 0, cpu],
                                            np.float64))
    comm.all_reduce(on_host)
    result = {"world": n, "nodes": len({m[0] for m in comm.members}), "allreduce_1k_us": mine * 1e6,
              "allreduce_1k_us_max_rank": float(every.numpy()[0]) * 1e6,
              "host_done": int(on_host.numpy()[0]), "host_handed": int(on_host.numpy()[1]),
              "rank_cpu_us_per_call": float(on_host.numpy()[2]) * 1e6}
    if ns.big:
        count = ns.big // 4
        big = rt.Tensor.from_numpy(pattern(count, r))
        t0 = time.perf_counter()
        comm.all_reduce(big, stream=stream)
        sync()
        result["big_bytes"], result["big_s"] = ns.big, time.perf_counter() - t0
        wrong = np.array([_wrong(big.numpy(), n)], np.int64)
        total = rt.Tensor.from_numpy(wrong)
        comm.all_reduce(total)
        result["big_wrong"] = int(total.numpy()[0])
    if r == 0:
        print("SCALE_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
