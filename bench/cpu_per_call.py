"""CPU time one collective costs each process: the rank and its card actor, per call.

    launch --nproc 8 bench/cpu_per_call.py                       # 1 KiB fp32 all_reduce, 1000 calls
    launch --nproc 8 bench/cpu_per_call.py --bytes 65536 --calls 500
    NPUSIM_HCCL_HOST_PATH=0 launch --nproc 8 bench/cpu_per_call.py   # every call through the card

On an oversubscribed laptop small collectives are CPU-bound: 8 ranks and 8 cards share the cores, so
the wall time of a call is roughly the CPU all 16 processes spend on it divided by the core count.
Each rank prints its wall time per call (mean and median of issue + synchronize) and the user+system
CPU per call of its own process and of its card's (the process at the other end of its channel).
"""

from __future__ import annotations

import argparse
import socket
import time

import numpy as np
import psutil

import hccl
import rt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=int, default=1024, help="message size per rank (fp32 all_reduce)")
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=50)
    ns = p.parse_args()
    comm = hccl.init()
    count = max(ns.bytes // 4, 1)
    src = rt.Tensor.from_numpy(np.ones(count, np.float32))
    dst = rt.empty((count,), np.float32)
    card = _card_process(rt.get_context().client)

    def call():
        hccl.all_reduce(src.ptr, dst.ptr, count, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm)
        rt.synchronize_stream(None)

    for _ in range(ns.warmup):
        call()
    me = psutil.Process()
    mine0, card0 = _cpu(me), _cpu(card)
    times = []
    start = time.perf_counter()
    for _ in range(ns.calls):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    mine, theirs = (_cpu(me) - mine0) / ns.calls, (_cpu(card) - card0) / ns.calls if card else float("nan")
    host = comm.host_path()
    where = f"host path {host.done} calls, handed to the card {host.handed}" if host else "host path off"
    print(f"rank {comm.rank}: {ns.bytes} B all_reduce: wall/call mean {wall / ns.calls * 1e6:.0f} µs, median "
          f"{np.median(times) * 1e6:.0f} µs; CPU/call rank {mine * 1e6:.0f} µs, card {theirs * 1e6:.0f} µs ({where})",
          flush=True)
    if not np.all(dst.numpy() == comm.size):
        raise SystemExit(f"rank {comm.rank}: wrong result")
    hccl.comm_destroy(comm)


def _card_process(client) -> psutil.Process | None:
    """The card actor's process: the peer of this context's Unix socket (None on in-process cards)."""
    sock = getattr(client.transport, "sock", None)
    if sock is None:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return psutil.Process(int.from_bytes(creds[:4], "little"))


def _cpu(proc) -> float:
    if proc is None:
        return float("nan")
    t = proc.cpu_times()
    return t.user + t.system


if __name__ == "__main__":
    main()
