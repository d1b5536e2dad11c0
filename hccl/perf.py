"""The rank body of ``hccl-test`` (nccl-tests-style runs of every collective): buffers, timed loops, the
numpy oracle, one row per size. The command that starts the ranks and prints the table is
``launcher/tools/hccl_test.py``; its docstring is the manual.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import time

import numpy as np

from .perfdata import (COLLECTIVES, NCCL_TYPE_NAMES, NO_IN_PLACE, NO_OUT_OF_PLACE, REDUCING, ROOTED, TIMING,
                       busbw_factor, cast, expected_output, layout, parse_size, rank_input, sweep,
                       MAX_SIZES)


# ---- inside a rank -------------------------------------------------------------------------------

class RankBench:
    """One rank's buffers and calls for one collective; everything on the communicator's card."""

    def __init__(self, ns, comm):
        import hccl
        import rt
        self.hccl, self.rt, self.ns, self.comm = hccl, rt, ns, comm
        self.rank, self.n = comm.rank, comm.size
        self.dt = np.dtype(hccl.types.hccl_np_dtype(ns.datatype))
        self.code = hccl.types.hccl_dtype(ns.datatype)
        self.op = hccl.types.reduce_op(ns.op)
        self.isz = self.dt.itemsize
        big = layout(ns.collective, max(ns.sizes), self.n, self.isz)
        self.send = rt.malloc(max(big["send"], 1) * self.isz)
        self.recv = rt.malloc(max(big["recv"], 1) * self.isz)
        self.send_cap, self.recv_cap = max(big["send"], 1) * self.isz, max(big["recv"], 1) * self.isz
        self.stats = rt.malloc(64)

    def pointers(self, lay: dict, in_place: bool) -> tuple[int, int]:
        """(send, recv) device pointers of one placement, nccl-tests style offsets for in place."""
        c = self.ns.collective
        if not in_place:
            return self.send, self.recv
        if c == "all_gather":
            return self.recv + self.rank * lay["count"] * self.isz, self.recv
        if c in ("reduce_scatter", "scatter"):
            return self.send, self.send + self.rank * lay["count"] * self.isz
        return self.send, self.send       # all_reduce, reduce, broadcast (one buffer)

    def call(self, lay: dict, send: int, recv: int) -> None:
        """Enqueue the collective once on the default stream."""
        h, c, comm, count, root = self.hccl, self.ns.collective, self.comm, lay["count"], self.ns.root
        if c == "all_reduce":
            h.all_reduce(send, recv, count, self.code, self.op, comm)
        elif c == "broadcast":
            h.broadcast(send, count, self.code, root, comm)
        elif c == "reduce":
            h.reduce(send, recv, count, self.code, self.op, root, comm)
        elif c == "all_gather":
            h.all_gather(send, recv, count, self.code, comm)
        elif c == "reduce_scatter":
            h.reduce_scatter(send, recv, count, self.code, self.op, comm)
        elif c == "scatter":
            h.scatter(send, recv, count, self.code, root, comm)
        elif c == "all_to_all":
            h.all_to_all(send, count, self.code, recv, count, self.code, comm)
        elif c == "send_recv":
            h.batch_send_recv([(h.HCCL_SEND, send, count, self.code, (self.rank + 1) % self.n),
                               (h.HCCL_RECV, recv, count, self.code, (self.rank - 1) % self.n)], comm)
        else:
            h.barrier(comm)

    def sync(self) -> None:
        self.rt.synchronize_stream(None)

    def upload(self, ptr: int, values: np.ndarray) -> None:
        a = np.ascontiguousarray(values)
        if a.nbytes:
            self.rt.memcpy(ptr, a.nbytes, a, a.nbytes, self.rt.ACL_MEMCPY_HOST_TO_DEVICE)

    def download(self, ptr: int, count: int, dt) -> np.ndarray:
        a = np.empty(count, dt)
        if a.nbytes:
            self.rt.memcpy(a, a.nbytes, ptr, a.nbytes, self.rt.ACL_MEMCPY_DEVICE_TO_HOST)
        return a

    def fill(self, lay: dict, in_place: bool) -> tuple[int, int]:
        """Input pattern into the send side; zeros (never a valid result) into a separate recv buffer."""
        send, recv = self.pointers(lay, in_place)
        if lay["recv"] and (not in_place or self.ns.collective == "all_gather"):
            self.rt.memset(recv, self.recv_cap, 0, lay["recv"] * self.isz)
        # in-place reduce_scatter / scatter: recv lies inside send and starts as this rank's input
        self.upload(send, cast(rank_input(self.ns.collective, self.rank, lay, self.ns.op), self.dt))
        return send, recv

    def timed(self, lay: dict, in_place: bool) -> float:
        """Median seconds of ns.iters calls, after ranks line up on a barrier."""
        send, recv = self.pointers(lay, in_place)
        self.hccl.barrier(self.comm)
        self.sync()
        times = []
        for _ in range(self.ns.iters):
            t0 = time.perf_counter()
            self.call(lay, send, recv)
            self.sync()
            times.append(time.perf_counter() - t0)
        return float(np.median(times)) if times else 0.0

    def wrong(self, lay: dict, in_place: bool) -> int:
        """Wrong elements of this rank over ns.check checked calls."""
        c = self.ns.collective
        bad = 0
        for _ in range(self.ns.check):
            send, recv = self.fill(lay, in_place)
            self.call(lay, send, recv)
            self.sync()
            want = expected_output(c, self.rank, self.n, lay, self.ns.op, self.ns.root)
            if want is None:
                continue
            got = self.download(recv, lay["recv"], self.dt)
            bad += int(np.count_nonzero(got != cast(want, self.dt)))
        return bad

    def across_ranks(self, values, dtype, op: str) -> np.ndarray:
        """Combine a few numbers over ranks with the communicator itself (as nccl-tests uses MPI)."""
        a = np.asarray(values, dtype)
        self.upload(self.stats, a)
        self.hccl.all_reduce(self.stats, self.stats, a.size, self.hccl.types.hccl_dtype(a.dtype), op, self.comm)
        self.sync()
        return self.download(self.stats, a.size, a.dtype)

    def devices(self) -> list[dict]:
        """Every rank's pid, node, card and host, gathered to all ranks."""
        info = struct.pack("<qqq64s", os.getpid(), int(os.environ.get("NPUSIM_NODE", "0")),
                           int(os.environ.get("DEVICE_ID", "0")), socket.gethostname().encode()[:64])
        width = len(info)
        src, dst = self.rt.malloc(width), self.rt.malloc(width * self.n)
        self.upload(src, np.frombuffer(info, np.uint8))
        self.hccl.all_gather(src, dst, width, self.hccl.HCCL_DATA_TYPE_UINT8, self.comm)
        self.sync()
        raw = self.download(dst, width * self.n, np.uint8).tobytes()
        self.rt.free(src)
        self.rt.free(dst)
        out = []
        for r in range(self.n):
            pid, node, dev, host = struct.unpack("<qqq64s", raw[r * width:(r + 1) * width])
            out.append({"rank": r, "pid": pid, "node": node, "device": dev,
                        "host": host.rstrip(b"\0").decode(errors="replace")})
        return out


def warm_up(bench: RankBench, sizes) -> None:
    """nccl-tests' TimeTest before its sweep: a barrier, then ``-w`` calls at the largest size and ``-w`` at the
    smallest (out of place, where the collective has it). A process's first collectives are slower than the rest
    (docs/performance.md, "Session 35"): without this the sweep's first size would time them."""
    bench.hccl.barrier(bench.comm)
    bench.sync()
    for nbytes in sizes:
        lay = layout(bench.ns.collective, nbytes, bench.n, bench.isz)
        send, recv = bench.fill(lay, bench.ns.collective in NO_OUT_OF_PLACE)
        for _ in range(bench.ns.warmup):
            bench.call(lay, send, recv)
        bench.sync()


def measure(bench: RankBench, nbytes: int) -> dict | None:
    """One table row (on rank 0; None elsewhere)."""
    ns, n = bench.ns, bench.n
    lay = layout(ns.collective, nbytes, n, bench.isz)
    groups = [False, True]
    meds, bad = [], []
    for in_place in groups:
        if (in_place and ns.collective in NO_IN_PLACE) or (not in_place and ns.collective in NO_OUT_OF_PLACE):
            meds.append(-1.0)
            bad.append(0)
            continue
        send, recv = bench.fill(lay, in_place)
        if in_place and ns.collective in REDUCING and bench.dt.kind == "f":
            # repeated in-place sums grow ×n per call and overflow to inf (numpy warns on the card);
            # zeros cost the same to add and stay finite. The checked calls refill the pattern.
            bench.rt.memset(send, bench.send_cap, 0, lay["send"] * bench.isz)
        for _ in range(ns.warmup):
            bench.call(lay, send, recv)
        bench.sync()
        meds.append(bench.timed(lay, in_place))
        bad.append(bench.wrong(lay, in_place) if ns.check else 0)
    worst = bench.across_ranks(meds, np.float64, "max")
    wrong = bench.across_ranks(bad, np.int64, "sum")
    if bench.rank != 0:
        return None
    factor = busbw_factor(ns.collective, n)
    row = {"size": lay["size"], "count": lay["elements"], "type": NCCL_TYPE_NAMES.get(bench.dt.name, bench.dt.name),
           "redop": ns.op if ns.collective in REDUCING else "none",
           "root": ns.root if ns.collective in ROOTED else -1}
    for name, t, w in zip(("out_of_place", "in_place"), worst, wrong):
        if t < 0:
            row[name] = None
            continue
        algbw = lay["size"] / t / 1e9 if t > 0 else 0.0
        row[name] = {"time_us": t * 1e6, "algbw": algbw, "busbw": algbw * factor,
                     "wrong": int(w) if ns.check else None}
    return row


def run_rank(ns) -> int:
    """Body of every rank process (``python -m hccl.perf <the command's arguments> --_result FILE``)."""
    if ns.algo:
        os.environ["HCCL_ALGO"] = ns.algo         # read at communicator init
    import hccl
    comm = hccl.init()
    bench = RankBench(ns, comm)
    devices = bench.devices()
    rows = []
    text = comm.rank == 0 and ns.format == "text"
    if text:
        for line in preamble(ns, devices, comm.size):
            print(line, flush=True)
    sizes = [0] if ns.collective == "barrier" else ns.sizes
    warm_up(bench, [max(sizes), min(sizes)])
    for nbytes in sizes:
        row = measure(bench, nbytes)
        if row is not None:
            rows.append(row)
            if text:
                print(format_row(row), flush=True)
    if comm.rank == 0:
        doc = document(ns, devices, comm.size, rows)
        if text:
            for line in footer(doc):
                print(line, flush=True)
        with open(ns.result_file, "w", encoding="utf-8") as f:
            json.dump(doc, f)
    return 0


# ---- output ----------------------------------------------------------------------------------------

def preamble(ns, devices: list, n: int) -> list[str]:
    import rt
    soc = rt.get_soc_name()
    lines = [f"# nThread 1 nGpus 1 minBytes {min(ns.sizes)} maxBytes {max(ns.sizes)} step: "
             + (f"{ns.stepfactor}(factor)" if ns.stepfactor > 1 else f"{ns.stepbytes}(bytes)")
             + f" warmup iters: {ns.warmup} iters: {ns.iters} agg iters: 1 validation: {1 if ns.check else 0}"
             + " graph: 0",
             f"# npusim hccl-test {ns.collective}: {n} ranks, HCCL_ALGO={ns.algo or '(automatic)'}; time = {TIMING}",
             "#", "# Using devices"]
    for d in devices:
        lines.append(f"#  Rank {d['rank']:2d} Group  0 Pid {d['pid']:6d} on {d['host']:>10s} device {d['device']:2d} "
                     f"[npu:{d['node']}:{d['device']}] {soc}")
    lines += ["#",
              f"# {'':47s}{'out-of-place':^33s}{'in-place':^33s}".rstrip(),
              f"# {'size':>10s} {'count':>12s} {'type':>8s} {'redop':>6s} {'root':>6s} "
              + f"{'time':>10s} {'algbw':>7s} {'busbw':>7s} {'#wrong':>6s}" * 2,
              f"# {'(B)':>10s} {'(elements)':>12s} {'':>8s} {'':>6s} {'':>6s} "
              + f"{'(us)':>10s} {'(GB/s)':>7s} {'(GB/s)':>7s} {'':>6s}" * 2]
    return lines


def format_row(row: dict) -> str:
    line = f"  {row['size']:>10d} {row['count']:>12d} {row['type']:>8s} {row['redop']:>6s} {row['root']:>6d} "
    for name in ("out_of_place", "in_place"):
        g = row[name]
        if g is None:
            line += f"{'N/A':>10s} {'N/A':>7s} {'N/A':>7s} {'N/A':>6s}"
        else:
            wrong = "N/A" if g["wrong"] is None else str(g["wrong"])
            line += f"{g['time_us']:>10.1f} {g['algbw']:>7.3f} {g['busbw']:>7.3f} {wrong:>6s}"
    return line.rstrip()


def document(ns, devices: list, n: int, rows: list) -> dict:
    groups = [row[g] for row in rows for g in ("out_of_place", "in_place") if row[g] is not None]
    wrong = sum(g["wrong"] or 0 for g in groups)
    avg = sum(g["busbw"] for g in groups) / len(groups) if groups else 0.0
    return {"collective": ns.collective, "nranks": n, "dtype": ns.datatype, "redop": ns.op, "root": ns.root,
            "algo": ns.algo or None, "warmup": ns.warmup, "iters": ns.iters, "check": ns.check, "timing": TIMING,
            "busbw_factor": busbw_factor(ns.collective, n), "devices": devices, "rows": rows,
            "wrong_total": wrong, "avg_busbw": avg}


def footer(doc: dict) -> list[str]:
    status = "OK" if doc["wrong_total"] == 0 else "FAILED"
    return [f"# Out of bounds values : {doc['wrong_total']} {status}",
            f"# Avg bus bandwidth    : {doc['avg_busbw']:.6g}", "#"]


# ---- the command -----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hccl-test", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("collective", choices=COLLECTIVES)
    p.add_argument("-p", "--nproc", type=int, default=8, help="ranks (per node) (default 8)")
    p.add_argument("--nnodes", type=int, default=1, help="simulated nodes (default 1)")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("32M"), help="first size (default 32M)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("32M"), help="last size (default 32M)")
    p.add_argument("-f", "--stepfactor", type=int, default=0, help="multiply the size by this each step")
    p.add_argument("-i", "--stepbytes", type=parse_size, default=parse_size("1M"), help="else add this (default 1M)")
    p.add_argument("-d", "--datatype", default="fp32", help="fp32 (default), fp16, bf16, fp64, int8..uint64")
    p.add_argument("-o", "--op", default="sum", choices=("sum", "prod", "max", "min"), help="reduction (default sum)")
    p.add_argument("-r", "--root", type=int, default=0, help="root of broadcast / reduce / scatter (default 0)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed calls per size and placement (default 20)")
    p.add_argument("-w", "--warmup", "--warmup_iters", dest="warmup", type=int, default=5, help="untimed calls (5)")
    p.add_argument("-c", "--check", type=int, default=1, help="checked calls per size and placement (default 1)")
    p.add_argument("--algo", default=None, help="HCCL_ALGO for the run, e.g. 'level0:ring' (default: automatic)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", dest="format", action="store_const", const="csv", help="print CSV rows")
    fmt.add_argument("--json", dest="format", action="store_const", const="json", help="print one JSON document")
    p.set_defaults(format="text")
    p.add_argument("-F", "--output-file", dest="output_file", default=None, help="also write rows here (CSV/.json)")
    p.add_argument("--config", default=None, help="simulated hardware config (as launch --config)")
    p.add_argument("--address", default=None, help="Ray cluster to join (as launch --address)")
    p.add_argument("--timeout", type=float, default=None, help="wall-clock limit in seconds")
    p.add_argument("--_result", dest="result_file", default=None, help=argparse.SUPPRESS)
    return p


def check_args(p: argparse.ArgumentParser, ns) -> None:
    import hccl
    try:
        hccl.types.hccl_np_dtype(ns.datatype)
    except hccl.HcclError as e:
        p.error(f"-d {ns.datatype}: {e.message}")
    if ns.nproc < 1 or ns.nnodes < 1:
        p.error(f"-p {ns.nproc} --nnodes {ns.nnodes}: expected positive numbers of ranks and nodes")
    n = ns.nproc * ns.nnodes
    if ns.collective in ROOTED and not 0 <= ns.root < n:
        p.error(f"-r {ns.root}: root must be in [0, {n})")
    if ns.collective == "send_recv" and n < 2:
        p.error("send_recv needs at least 2 ranks")
    if ns.minbytes > ns.maxbytes:
        p.error(f"-b {ns.minbytes} is larger than -e {ns.maxbytes}")
    if ns.stepfactor <= 1 and ns.stepbytes <= 0:
        p.error("give -f FACTOR > 1 or -i STEP > 0")
    if ns.iters < 1 or ns.warmup < 0 or ns.check < 0:
        p.error(f"-n {ns.iters} -w {ns.warmup} -c {ns.check}: expected n >= 1, w >= 0, c >= 0")
    # a -f sweep is at most ~40 sizes (sizes stop at 1 TiB); an -i sweep's list could outgrow memory long before
    # the run would end (-b 0 -e 1G -i 1 is a billion sizes): count it without building it
    walked = (ns.maxbytes - ns.minbytes) // ns.stepbytes + 1 if ns.stepfactor <= 1 else 0
    if walked > MAX_SIZES:
        p.error(f"-b {ns.minbytes} -e {ns.maxbytes} -i {ns.stepbytes} walks {walked} sizes; at most {MAX_SIZES} "
                f"(use a larger -i, or -f)")
    ns.sizes = sweep(ns.minbytes, ns.maxbytes, ns.stepfactor, ns.stepbytes)


def main(argv: list[str] | None = None) -> int:
    """Entry point of one rank (started by ``hccl-test``, ``launcher/tools/hccl_test.py``)."""
    parser = build_parser()
    try:
        ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
        check_args(parser, ns)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    return run_rank(ns)


if __name__ == "__main__":
    sys.exit(main())
