"""The distributed test loop: what a multi-rank test costs, npusim beside torch's mp.spawn + gloo and torchrun.

    python bench/test_loop.py                     # all four measurements, 3 rounds, alternating with the peers
    python bench/test_loop.py --only spawn,suite --rounds 5 --json-out /tmp/loop.json

Measured, round after round in the same order (ours, peer, ours, peer, ...):
  spawn    ``launcher.spawn(fn, nproc=8)`` in this process (its own embedded Ray session, warm cards): seconds
           from the call to the per-rank results of one 1 KiB all_reduce. The first call (cold cards) is
           reported apart; the figure is the median of the warm ones.
  launch   ``launch --nproc 8 bench/peers/hccl_first.py`` cold (``NPUSIM_CLUSTER=0``: embedded Ray booted by
           the launch) and with a persistent local cluster (``launch --up`` once, before the rounds) vs
           ``torchrun --nproc-per-node 8`` + gloo: seconds from process start to rank 0's first completed
           all_reduce.
  suite    20 tiny distributed tests (all_reduce, broadcast, all_gather, reduce_scatter, ... on ``--test-nproc``
           ranks, each checked against numpy) as one pytest run through the ``npu_spawn`` fixture, vs the same 20
           tests written with ``torch.multiprocessing.spawn`` + gloo: wall seconds of the whole pytest process
           (ours twice: on the session the plugin embeds, and borrowing the ``launch --up`` cluster's cards).
Nothing here asserts a time; the table reports medians and ratios ours/peer (< 1: ours is faster).
Needs torch for the peers (the ``bench`` extra); without it the peer columns are skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
import compare  # noqa: E402  (run_child, startup, torchrun: the same process-group handling)

COLLECTIVES = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "reduce"]


# ---- warm spawn -------------------------------------------------------------------------------------------

def first_all_reduce():
    """One rank of the spawn probe: a 1 KiB fp32 all_reduce, result back to the caller."""
    import numpy as np
    import hccl
    import rt
    comm = hccl.init()
    a = np.full(256, comm.rank + 1, np.float32)
    buf = rt.malloc(a.nbytes)
    rt.memcpy(buf, a.nbytes, a, a.nbytes, rt.ACL_MEMCPY_HOST_TO_DEVICE)
    hccl.all_reduce(buf, buf, 256, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm)
    rt.synchronize_stream(None)
    out = np.empty_like(a)
    rt.memcpy(out, a.nbytes, buf, a.nbytes, rt.ACL_MEMCPY_DEVICE_TO_HOST)
    return float(out[0])


def spawn_times(nproc: int, calls: int) -> tuple[float, list[float]]:
    import launcher
    from rt.config import load_config
    from rt.ray import session
    env = os.environ.get("NPUSIM_CLUSTER")
    os.environ["NPUSIM_CLUSTER"] = "0"           # this process's own session, even when a cluster is up
    session.start_local_ray(load_config(None))
    session._started_here = False                # ours to stop below, like the pytest plugin's session
    want = float(nproc * (nproc + 1) / 2)
    times = []
    try:
        for _ in range(calls + 1):
            t = time.perf_counter()
            got = launcher.spawn(first_all_reduce, nproc=nproc, timeout=120)
            times.append(time.perf_counter() - t)
            if got != [want] * nproc:
                raise SystemExit(f"spawn probe: got {got}, expected {[want] * nproc}")
    finally:
        session._started_here = True
        session.stop_ray()
        if env is None:
            os.environ.pop("NPUSIM_CLUSTER", None)
        else:
            os.environ["NPUSIM_CLUSTER"] = env
    return times[0], times[1:]


def spawn_in_child(nproc: int, calls: int, ns, log) -> tuple[float, list[float]] | None:
    """The spawn probe in a fresh interpreter (so this one stays free of Ray)."""
    code, out, _ = compare.run_child([sys.executable, os.path.abspath(__file__), "--spawn-probe",
                                      str(nproc), str(calls)], ns.timeout, log)
    for line in out.splitlines():
        if line.startswith("SPAWN_TIMES "):
            first, *rest = json.loads(line[len("SPAWN_TIMES "):])
            return first, rest
    return None


# ---- the 20 tiny tests ------------------------------------------------------------------------------------

def cases() -> list[tuple[str, int, str]]:
    """(collective, count, dtype): 20 tiny tests."""
    out = []
    for coll in COLLECTIVES:
        for count, dtype in ((8, "float32"), (100, "float32"), (64, "int32"), (1000, "float32")):
            out.append((coll, count, dtype))
    return out


OURS_TESTS = '''
import numpy as np
import pytest

CASES = {cases!r}


def run_case(coll, count, dtype):
    import hccl
    import rt
    comm = hccl.init()
    n, r = comm.size, comm.rank
    dt = {{"float32": hccl.HCCL_DATA_TYPE_FP32, "int32": hccl.HCCL_DATA_TYPE_INT32}}[dtype]
    x = (np.arange(count) % 13 + r).astype(dtype)
    out_count = {{"all_gather": count * n, "reduce_scatter": count // n}}.get(coll, count)
    src, dst = rt.malloc(x.nbytes), rt.malloc(max(out_count, 1) * x.itemsize)
    rt.memcpy(src, x.nbytes, x, x.nbytes, rt.ACL_MEMCPY_HOST_TO_DEVICE)
    if coll == "all_reduce":
        hccl.all_reduce(src, dst, count, dt, hccl.HCCL_REDUCE_SUM, comm)
    elif coll == "broadcast":
        hccl.broadcast(src, count, dt, 0, comm)
        dst = src
    elif coll == "all_gather":
        hccl.all_gather(src, dst, count, dt, comm)
    elif coll == "reduce_scatter":
        hccl.reduce_scatter(src, dst, count // n, dt, hccl.HCCL_REDUCE_SUM, comm)
    else:
        hccl.reduce(src, dst, count, dt, hccl.HCCL_REDUCE_SUM, 0, comm)
    rt.synchronize_stream(None)
    got = np.empty(out_count, dtype)
    if coll != "reduce" or r == 0:
        rt.memcpy(got, got.nbytes, dst, got.nbytes, rt.ACL_MEMCPY_DEVICE_TO_HOST)
    return got if coll != "reduce" or r == 0 else None


@pytest.mark.parametrize("coll,count,dtype", CASES)
def test_case(npu_spawn, coll, count, dtype):
    n = {nproc}
    xs = [(np.arange(count) % 13 + r).astype(dtype) for r in range(n)]
    got = npu_spawn(run_case, nproc=n, args=(coll, count, dtype))
    total = sum(xs)
    want = {{"all_reduce": [total] * n, "broadcast": [xs[0]] * n, "all_gather": [np.concatenate(xs)] * n,
            "reduce_scatter": [total[i * (count // n):(i + 1) * (count // n)] for i in range(n)],
            "reduce": [total] + [None] * (n - 1)}}[coll]
    for g, w in zip(got, want):
        if w is None:
            assert g is None
        else:
            np.testing.assert_allclose(g, w, rtol=1e-6)
'''

GLOO_TESTS = '''
import os
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CASES = {cases!r}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_case(r, n, port, coll, count, dtype, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=r, world_size=n)
    x = torch.from_numpy((np.arange(count) % 13 + r).astype(dtype))
    if coll == "all_reduce":
        dist.all_reduce(x)
        got = x
    elif coll == "broadcast":
        dist.broadcast(x, 0)
        got = x
    elif coll == "all_gather":
        parts = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(parts, x)
        got = torch.cat(parts)
    elif coll == "reduce_scatter":
        got = torch.empty(count // n, dtype=x.dtype)
        dist.reduce_scatter(got, list(x.chunk(n)))
    else:
        dist.reduce(x, 0)
        got = x if r == 0 else None
    queue.put((r, None if got is None else got.numpy().copy()))
    dist.destroy_process_group()


@pytest.mark.parametrize("coll,count,dtype", CASES)
def test_case(coll, count, dtype):
    n = {nproc}
    xs = [(np.arange(count) % 13 + r).astype(dtype) for r in range(n)]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(run_case, args=(n, free_port(), coll, count, dtype, queue), nprocs=n, join=True)
    got = dict(queue.get() for _ in range(n))
    total = sum(xs)
    want = {{"all_reduce": [total] * n, "broadcast": [xs[0]] * n, "all_gather": [np.concatenate(xs)] * n,
            "reduce_scatter": [total[i * (count // n):(i + 1) * (count // n)] for i in range(n)],
            "reduce": [total] + [None] * (n - 1)}}[coll]
    for r, w in enumerate(want):
        if w is None:
            assert got[r] is None
        else:
            np.testing.assert_allclose(got[r], w, rtol=1e-6)
'''


def suite_time(kind: str, nproc: int, ns, log, use_cluster: bool = False) -> float | None:
    """Wall seconds of one pytest process running the 20 tests (ours through npu_spawn, or mp.spawn + gloo)."""
    work = tempfile.mkdtemp(prefix="npusim-loop-")
    try:
        path = os.path.join(work, f"test_{kind}.py")
        with open(path, "w") as f:
            f.write(textwrap.dedent((OURS_TESTS if kind == "ours" else GLOO_TESTS).format(cases=cases(),
                                                                                        nproc=nproc)))
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", path]
        os.environ["NPUSIM_CLUSTER"] = "1" if use_cluster else "0"
        try:
            t = time.perf_counter()
            code, out, _ = compare.run_child(cmd, ns.timeout, log, scratch=kind != "ours")
            took = time.perf_counter() - t
        finally:
            os.environ.pop("NPUSIM_CLUSTER", None)
        tail = out.strip().splitlines()[-1] if out.strip() else "(no output)"
        if code != 0 or "20 passed" not in tail:
            print(f"  suite {kind}: failed ({tail}); see {ns.log}", file=sys.stderr)
            return None
        return took
    finally:
        import shutil
        shutil.rmtree(work, ignore_errors=True)


# ---- launch -----------------------------------------------------------------------------------------------

def launch_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "launcher", *args]


def cluster(up: bool, log) -> bool:
    code, out, _ = compare.run_child(launch_cmd("--up") if up else launch_cmd("--down"), 300, log)
    return code == 0


def startup_ours(ns, log, use_cluster: bool) -> float | None:
    os.environ["NPUSIM_CLUSTER"] = "1" if use_cluster else "0"
    try:
        return compare.startup("ours", ns, log)
    finally:
        os.environ.pop("NPUSIM_CLUSTER", None)


# ---- report -----------------------------------------------------------------------------------------------

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, unit="s"):
    return "—" if x is None else f"{x:.3f} {unit}"


def ratio(a, b):
    return "—" if a is None or b is None else f"{a / b:.3f}×"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="test_loop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-p", "--nproc", type=int, default=8, help="ranks of the spawn and launch probes (default 8)")
    p.add_argument("--test-nproc", type=int, default=4, help="ranks of each of the 20 tiny tests (default 4)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--spawn-calls", type=int, default=10, help="warm spawn calls per round (default 10)")
    p.add_argument("--only", default="spawn,launch,cluster,suite")
    p.add_argument("--timeout", type=float, default=900, help="per child process, seconds")
    p.add_argument("--log", default="/tmp/npusim-test-loop.log")
    p.add_argument("--json-out", default=None)
    p.add_argument("--spawn-probe", nargs=2, type=int, help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.spawn_probe:
        first, rest = spawn_times(*ns.spawn_probe)
        print("SPAWN_TIMES " + json.dumps([first, *rest]), flush=True)
        return 0
    only = set(ns.only.split(","))
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
        print("note: torch is not installed (pip install -e '.[bench]'): no torchrun / mp.spawn columns")
    res = {"spawn_first": [], "spawn_warm": [], "launch_cold": [], "launch_cluster": [], "torchrun": [],
           "suite_ours": [], "suite_cluster": [], "suite_gloo": []}
    with open(ns.log, "a") as log:
        cluster_up = "cluster" in only and cluster(True, log)
        try:
            for rnd in range(ns.rounds):
                print(f"round {rnd + 1}/{ns.rounds}", flush=True)
                if "spawn" in only:
                    got = spawn_in_child(ns.nproc, ns.spawn_calls, ns, log)
                    if got:
                        res["spawn_first"].append(got[0])
                        res["spawn_warm"].extend(got[1])
                if "launch" in only or "cluster" in only:
                    if "launch" in only:
                        res["launch_cold"].append(startup_ours(ns, log, use_cluster=False))
                    if cluster_up:
                        res["launch_cluster"].append(startup_ours(ns, log, use_cluster=True))
                    if have_torch:
                        res["torchrun"].append(compare.startup("gloo", ns, log))
                if "suite" in only:
                    res["suite_ours"].append(suite_time("ours", ns.test_nproc, ns, log))
                    if cluster_up:
                        res["suite_cluster"].append(suite_time("ours", ns.test_nproc, ns, log, use_cluster=True))
                    if have_torch:
                        res["suite_gloo"].append(suite_time("gloo", ns.test_nproc, ns, log))
        finally:
            if cluster_up:
                cluster(False, log)
    m = {k: med(v) for k, v in res.items()}
    print(f"\n{ns.rounds} rounds, {ns.nproc} ranks (tests: {ns.test_nproc}), {os.cpu_count()} cores")
    print(f"  warm spawn → results        {fmt(m['spawn_warm'])}   (first, cold cards: {fmt(m['spawn_first'])})")
    print(f"  cold launch → 1st all_reduce {fmt(m['launch_cold'])}   torchrun+gloo {fmt(m['torchrun'])}"
          f"   ratio {ratio(m['launch_cold'], m['torchrun'])}")
    print(f"  launch on `launch --up`      {fmt(m['launch_cluster'])}   ratio to torchrun "
          f"{ratio(m['launch_cluster'], m['torchrun'])}")
    print(f"  20 tiny tests (pytest wall)  {fmt(m['suite_ours'])}   mp.spawn+gloo {fmt(m['suite_gloo'])}"
          f"   ratio {ratio(m['suite_ours'], m['suite_gloo'])}")
    print(f"  the same on `launch --up`    {fmt(m['suite_cluster'])}   ratio {ratio(m['suite_cluster'], m['suite_gloo'])}")
    if ns.json_out:
        with open(ns.json_out, "w") as f:
            json.dump({"raw": res, "median": m, "nproc": ns.nproc, "test_nproc": ns.test_nproc}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
