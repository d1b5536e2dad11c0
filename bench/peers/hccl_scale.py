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


def pattern(count: int, rank: int, first: int = 0) -> np.ndarray:
    """Elements ``first`` … ``first + count - 1`` of rank ``rank``'s input."""
    return ((np.arange(first, first + count, dtype=np.int64) * 7 + 31 * rank) % 101 + 1).astype(np.float32)


def _wrong(got: np.ndarray, n: int, first: int = 0) -> int:
    """Elements of the all_reduced pattern that differ from its sum over ranks (``got`` holds elements ``first``
    on; the caller passes a chunk at a time). Element i of rank k's pattern is (7i + 31k) % 101 + 1, so the sum
    depends only on 7i % 101: one table of 101 sums."""
    residue = np.arange(101)
    table = sum(((residue + 31 * k) % 101 + 1) for k in range(n)).astype(np.float64)
    i = np.arange(first, first + got.size, dtype=np.int64)
    return int(np.count_nonzero(got != table[(i * 7) % 101]))


def big_all_reduce(comm, nbytes: int, stream, sync, chunk: int = 1 << 18) -> dict:
    """One in-place all_reduce of ``nbytes`` checked element by element, holding only the card tensor at full
    size: the pattern is written and the result read back ``chunk`` elements (1 MiB) at a time (256 ranks x 64 MiB is
    16 GiB of card memory; a full-size host input and host copy per rank would triple it)."""
    r, n = comm.rank, comm.size
    count = nbytes // 4
    big = rt.empty(count, np.float32)
    for start in range(0, count, chunk):
        part = pattern(min(chunk, count - start), r, start)
        big.view(part.shape, offset=start * 4).copy_from(part)
    comm.barrier(stream=stream)                 # every rank's input is written: time the call alone
    sync()
    t0 = time.perf_counter()
    comm.all_reduce(big, stream=stream)
    sync()
    seconds = time.perf_counter() - t0
    wrong = 0
    for start in range(0, count, chunk):
        size = min(chunk, count - start)
        wrong += _wrong(big.view((size,), offset=start * 4).numpy(), n, first=start)
    big.free()
    total = rt.Tensor.from_numpy(np.array([wrong], np.int64))
    comm.all_reduce(total)
    return {"big_bytes": nbytes, "big_s": seconds, "big_wrong": int(total.numpy()[0])}


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
    t = rt.Tensor.from_numpy(np.zeros(256, np.float32))   # summed in place again and again: stays finite
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
        result.update(big_all_reduce(comm, ns.big, stream, sync))
    if r == 0:
        print("SCALE_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
