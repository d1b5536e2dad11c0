"""npusim collectives beside torch.distributed (gloo) and Open MPI, in one run, on the same machine.

    python bench/compare.py          # 8 ranks, fp32 all_reduce 1K..64M ×4, broadcast, all_gather, reduce_scatter 16M
    python bench/compare.py --rounds 3 --peers gloo,mpi --json-out /tmp/compare.json
    python bench/compare.py --quick              # 1K..1M, 1 round: a smoke run
    python bench/compare.py --two-nodes          # also 16 ranks on 2 simulated nodes vs 8 on 1 (64 MiB)

What it runs, round after round in the same order (ours, gloo, mpi, ours, gloo, mpi, ...):
  ours  ``python -m launcher.tools.hccl_test <coll> -p N ... --json`` (``hccl-test``; each call its own ``launch``)
  gloo  ``torchrun --nproc-per-node N bench/peers/gloo_allreduce.py <coll> ...`` (needs torch: the
        ``bench`` extra; skipped with a note when it is missing)
  mpi   ``mpirun -np N python bench/peers/mpi_allreduce.py <coll> ...`` (needs mpi4py + Open MPI;
        skipped with a note when missing)
All three warm up as nccl-tests' TimeTest (``-w`` calls at the largest size, then at the smallest, before the
sweep, and ``-w`` more before each size), time a call the same way (blocking call, host clock, per-rank median,
max over ranks) and
check the result once against numpy. The table shows per-size medians over rounds, busbw derived
from the median time, and ratios ours/peer (time: < 1 is faster; busbw: > 1 is faster).

Start-up: ``launch --nproc N bench/peers/hccl_first.py`` vs ``torchrun --nproc-per-node N
bench/peers/gloo_allreduce.py all_reduce --first-only`` (and mpirun for reference), alternating,
``--startup-rounds`` times: seconds from just before the process is started to the unix time
rank 0 prints when its first all_reduce has completed.

Yardstick: ``np.copyto`` of 64 MiB between warm buffers, in one process and in two processes at
once, measured in the same run. Every child runs in its own process group, which is killed (by
that group id, never by name) if it overruns ``--timeout``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS_DIR = os.path.join(ROOT, "bench", "peers")
FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0,
          "reduce_scatter": lambda n: (n - 1) / n}
sys.path.insert(0, ROOT)
from hccl.perf import parse_size, sweep  # noqa: E402


# ---- running children --------------------------------------------------------------------------------

def run_child(cmd: list[str], timeout: float, log, scratch: bool = False) -> tuple[int, str, float]:
    """(exit code, stdout, start time) of cmd; its process group is killed if it overruns. ``scratch``: the
    child gets its own TMPDIR, removed afterwards (torchrun leaves a torchelastic_* directory per run)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if scratch:
        env["TMPDIR"] = tempfile.mkdtemp(prefix="npusim-compare-")
        try:
            return _run_child(cmd, timeout, log, env)
        finally:
            shutil.rmtree(env["TMPDIR"], ignore_errors=True)
    return _run_child(cmd, timeout, log, env)


def _run_child(cmd: list[str], timeout: float, log, env: dict) -> tuple[int, str, float]:
    log.write(f"\n$ {' '.join(cmd)}\n")
    log.flush()
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)       # the group this child leads: only what we started
            except ProcessLookupError:
                break
            try:
                out, _ = proc.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                out = ""
        log.write(f"!! timed out after {timeout:g} s: {' '.join(cmd)}\n")
        return 124, out or "", start
    log.write(out)
    return proc.returncode, out, start


def torchrun() -> list[str]:
    exe = shutil.which("torchrun")
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


def mpirun(n: int) -> list[str]:
    cmd = ["mpirun", "--oversubscribe", "-np", str(n)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    return cmd


def sweep_args(ns, coll: str) -> list[str]:
    b, e = (ns.big, ns.big) if coll != "all_reduce" else (ns.minbytes, ns.maxbytes)
    return [coll, "-b", str(b), "-e", str(e), "-f", str(ns.stepfactor), "-n", str(ns.iters), "-w", str(ns.warmup)]


def run_peer(peer: str, coll: str, ns, log) -> list[dict] | None:
    """Rows {size, time_us} of one run, or None if it failed (the log says why)."""
    if peer == "ours":
        cmd = [sys.executable, "-m", "launcher.tools.hccl_test", *sweep_args(ns, coll), "-p", str(ns.nproc), "-c", "1", "--json"]
        code, out, _ = run_child(cmd, ns.timeout, log)
        if code != 0:
            return None
        doc = json.loads(out)
        return [{"size": r["size"], "time_us": (r["out_of_place"] or r["in_place"])["time_us"],
                 "wrong": (r["out_of_place"] or r["in_place"])["wrong"]} for r in doc["rows"]]
    script = os.path.join(PEERS_DIR, "gloo_allreduce.py" if peer == "gloo" else "mpi_allreduce.py")
    launcher = [*torchrun(), "--nproc-per-node", str(ns.nproc), script] if peer == "gloo" else \
        [*mpirun(ns.nproc), sys.executable, script]
    code, out, _ = run_child([*launcher, *sweep_args(ns, coll)], ns.timeout, log, scratch=True)
    line = next((ln for ln in out.splitlines() if ln.startswith("PEER_RESULT ")), None)
    if code != 0 or line is None:
        return None
    return json.loads(line.removeprefix("PEER_RESULT "))["rows"]


def startup(peer: str, ns, log) -> float | None:
    """Seconds from process start to rank 0's first completed all_reduce."""
    if peer == "ours":
        cmd = [sys.executable, "-m", "launcher", "--nproc", str(ns.nproc), os.path.join(PEERS_DIR, "hccl_first.py")]
    elif peer == "gloo":
        cmd = [*torchrun(), "--nproc-per-node", str(ns.nproc), os.path.join(PEERS_DIR, "gloo_allreduce.py"),
               "all_reduce", "--first-only"]
    else:
        cmd = [*mpirun(ns.nproc), sys.executable, os.path.join(PEERS_DIR, "mpi_allreduce.py"), "all_reduce",
               "--first-only"]
    code, out, start = run_child(cmd, ns.timeout, log, scratch=peer != "ours")
    m = re.search(r"FIRST_COLLECTIVE (\d+\.\d+)", out)
    return float(m.group(1)) - start if code == 0 and m else None


def two_nodes(ns, log) -> dict | None:
    """64 MiB all_reduce busbw: 16 ranks on two simulated nodes vs 8 ranks on one, same Ray cluster."""
    from ray.cluster_utils import Cluster    # Ray only for this optional part
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"NPU": ns.nproc},
                                                           "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=2, resources={"NPU": ns.nproc})
        out = {}
        for nodes in (2, 1):
            cmd = [sys.executable, "-m", "launcher.tools.hccl_test", "all_reduce", "-p", str(ns.nproc), "--nnodes", str(nodes),
                   "-b", "64M", "-e", "64M", "-n", "5", "-w", "2", "-c", "1", "--json", "--address", cluster.address]
            code, text, _ = run_child(cmd, ns.timeout, log)
            if code != 0:
                return None
            row = json.loads(text)["rows"][0]["out_of_place"]
            out[nodes] = {"time_us": row["time_us"], "busbw": row["busbw"], "wrong": row["wrong"]}
        return out
    finally:
        cluster.shutdown()


# ---- the physical yardstick -------------------------------------------------------------------------

def _copy_worker(nbytes: int, reps: int, barrier, queue) -> None:
    import numpy as np
    src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    for _ in range(3):                     # warm: first touch runs at ~0.4 GB/s on this VM
        np.copyto(dst, src)
    barrier.wait()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    queue.put(statistics.median(times))


def copy_bandwidth(procs: int, nbytes: int = 64 << 20, reps: int = 10) -> float:
    """GB/s of np.copyto(64 MiB) summed over `procs` processes copying at the same time."""
    ctx = mp.get_context("fork")
    barrier, queue = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_copy_worker, args=(nbytes, reps, barrier, queue)) for _ in range(procs)]
    for w in workers:
        w.start()
    medians = [queue.get(timeout=120) for _ in workers]
    for w in workers:
        w.join()
    return procs * nbytes / max(medians) / 1e9


# ---- tables ---------------------------------------------------------------------------------------------

def human(nbytes: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size and nbytes % size == 0:
            return f"{nbytes // size} {unit}"
    return f"{nbytes} B"


def fmt_time(us: float) -> str:
    return f"{us:.0f} µs" if us < 1000 else f"{us / 1000:.3g} ms"


def summarize(runs: dict, coll: str, n: int) -> dict:
    """{peer: {size: {time_us, busbw, runs, wrong}}} from per-round rows: median time, busbw from it."""
    out = {}
    for peer, rounds in runs.items():
        by_size = {}
        for rows in rounds:
            for r in rows or []:
                by_size.setdefault(r["size"], []).append(r)
        out[peer] = {}
        for size, rs in sorted(by_size.items()):
            t = statistics.median(r["time_us"] for r in rs)
            out[peer][size] = {"time_us": t, "busbw": size / (t * 1e-6) / 1e9 * FACTOR[coll](n), "runs": len(rs),
                               "wrong": sum(r["wrong"] or 0 for r in rs)}
    return out


def table(summary: dict, coll: str, peers: list[str]) -> list[str]:
    head = ["size", "ours time", "ours busbw"]
    for p in peers:
        head += [f"{p} time", f"{p} busbw", f"ours/{p} time", f"ours/{p} busbw"]
    lines = [f"{coll} (fp32, busbw in GB/s; per-size medians over rounds)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for size, o in summary["ours"].items():
        cells = [human(size), fmt_time(o["time_us"]), f"{o['busbw']:.3f}"]
        for p in peers:
            q = summary.get(p, {}).get(size)
            if q is None:
                cells += ["—"] * 4
                continue
            cells += [fmt_time(q["time_us"]), f"{q['busbw']:.3f}", f"{o['time_us'] / q['time_us']:.2f}",
                      f"{o['busbw'] / q['busbw']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    wrong = {p: sum(v["wrong"] for v in s.values()) for p, s in summary.items()}
    lines += ["", f"wrong elements (all runs): {wrong}"]
    return lines


def targets(results: dict, starts: dict, nodes: dict | None = None) -> list[str]:
    """The issue's targets, met or missed and by how much."""
    out = ["| target | measured | needed | verdict |", "|---|---|---|---|"]

    def check(name, value, need, higher_is_better=True, unit="×"):
        if value is None:
            out.append(f"| {name} | n/a | {need:g}{unit} | not measured |")
            return
        ok = value >= need if higher_is_better else value <= need
        by = value / need
        verdict = "met" if ok else f"missed ({by:.2f} of the target)" if higher_is_better else \
            f"missed ({by:.2f}× the limit)"
        sign = "≥" if higher_is_better else "≤"
        out.append(f"| {name} | {value:.3g}{unit} | {sign} {need:g}{unit} | {verdict} |")

    def ratio(coll, size, peer):
        s = results.get(coll, {})
        if size in s.get("ours", {}) and size in s.get(peer, {}):
            return s["ours"][size]["busbw"] / s[peer][size]["busbw"]
        return None

    for size in (16 << 20, 64 << 20):
        check(f"all_reduce busbw {human(size)} vs gloo", ratio("all_reduce", size, "gloo"), 3.0)
        check(f"all_reduce busbw {human(size)} vs Open MPI", ratio("all_reduce", size, "mpi"), 1.0)
    one_k = results.get("all_reduce", {}).get("ours", {}).get(1024)
    check("all_reduce 1 KiB latency", one_k["time_us"] / 1000 if one_k else None, 1.0, False, " ms")
    for coll in ("broadcast", "all_gather", "reduce_scatter"):
        sizes = list(results.get(coll, {}).get("ours", {}))
        for peer, need in (("gloo", 2.0), ("mpi", 1.2))[coll == "reduce_scatter":]:
            check(f"{coll} busbw {human(sizes[0]) if sizes else '(not run)'} vs {peer}",
                  ratio(coll, sizes[0], peer) if sizes else None, need)
    ours, mpi = (results.get("all_reduce", {}).get(p, {}) for p in ("ours", "mpi"))
    for size in [s for s in (1 << 10, 4 << 10, 16 << 10, 64 << 10) if s in ours and s in mpi]:
        check(f"all_reduce {human(size)} time vs Open MPI", ours[size]["time_us"] / mpi[size]["time_us"], 2.0, False)
    if starts.get("ours") and starts.get("gloo"):
        check("launch start → first collective vs torchrun + gloo",
              statistics.median(starts["ours"]) / statistics.median(starts["gloo"]), 0.75, False)
    if nodes:
        check("hierarchical all_reduce 64 MiB busbw, 16 ranks / 2 nodes vs 8 ranks / 1 node",
              nodes[2]["busbw"] / nodes[1]["busbw"], 0.5)
    return out


# ---- main -----------------------------------------------------------------------------------------------

def machine() -> dict:
    import psutil
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    versions = {"python": platform.python_version()}
    for mod in ("numpy", "ray", "torch", "mpi4py"):
        if importlib.util.find_spec(mod):
            versions[mod] = __import__(mod).__version__
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(psutil.virtual_memory().total / 2 ** 30, 1),
            "kernel": platform.release(), **versions}


def available(peer: str) -> str | None:
    """None if the peer can run, else why not."""
    if peer == "gloo" and not importlib.util.find_spec("torch"):
        return "torch is not installed (pip install 'npusim[bench]', i.e. torch==2.13.0)"
    if peer == "mpi" and not (importlib.util.find_spec("mpi4py") and shutil.which("mpirun")):
        return "mpi4py / mpirun not installed (apt-get install openmpi-bin libopenmpi-dev; pip install mpi4py)"
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-p", "--nproc", type=int, default=8)
    p.add_argument("-b", "--minbytes", default="1K")
    p.add_argument("-e", "--maxbytes", default="64M")
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("--big", default="16M",
                   help="size of the broadcast, all_gather and reduce_scatter rows (default 16M)")
    p.add_argument("--rounds", type=int, default=3, help="bandwidth rounds (0: start-up comparison only)")
    p.add_argument("--startup-rounds", type=int, default=3)
    p.add_argument("--peers", default="gloo,mpi")
    p.add_argument("--collectives", default="all_reduce,broadcast,all_gather,reduce_scatter")
    p.add_argument("--timeout", type=float, default=900, help="per child process, seconds")
    p.add_argument("--log", default="/tmp/npusim-compare.log", help="children's stderr and commands")
    p.add_argument("--json-out", default=None, help="write every raw figure here")
    p.add_argument("--two-nodes", action="store_true",
                   help="also 16 ranks on a two-node ray.cluster_utils.Cluster vs 8 ranks, all_reduce 64 MiB")
    p.add_argument("--quick", action="store_true", help="1K..1M, 1 round, 1 start-up round, n=5 w=2")
    ns = p.parse_args(argv)
    if ns.quick:
        ns.maxbytes, ns.big, ns.rounds, ns.startup_rounds, ns.iters, ns.warmup = "1M", "1M", 1, 1, 5, 2
    peers = []
    for peer in [x for x in ns.peers.split(",") if x]:
        why = available(peer)
        print(f"# {peer}: skipped — {why}" if why else f"# {peer}: available")
        if not why:
            peers.append(peer)
    colls = [c for c in ns.collectives.split(",") if c]
    info = machine()
    print(f"# machine: {info}")
    nsizes = len(sweep(parse_size(ns.minbytes), parse_size(ns.maxbytes), ns.stepfactor, 0))
    print(f"# sizes {ns.minbytes}..{ns.maxbytes} ×{ns.stepfactor} ({nsizes} sizes), {ns.nproc} ranks, "
          f"n={ns.iters} w={ns.warmup}, {ns.rounds} rounds; children's stderr → {ns.log}")
    loads = [os.getloadavg()]
    copy = {"before": {1: copy_bandwidth(1), 2: copy_bandwidth(2)}}
    print(f"# np.copyto 64 MiB: {copy['before'][1]:.2f} GB/s (1 process), {copy['before'][2]:.2f} GB/s (2 at once)",
          flush=True)
    raw = {c: {peer: [] for peer in ["ours", *peers]} for c in colls}
    starts = {peer: [] for peer in ["ours", *peers]}
    t_begin = time.time()
    with open(ns.log, "a", encoding="utf-8") as log:
        for rnd in range(ns.rounds):
            for coll in colls:
                for peer in ["ours", *peers]:
                    t0 = time.time()
                    rows = run_peer(peer, coll, ns, log)
                    loads.append(os.getloadavg())
                    raw[coll][peer].append(rows)
                    print(f"# round {rnd + 1} {coll:<10s} {peer:<5s} {'ok' if rows else 'FAILED (see log)'} "
                          f"{time.time() - t0:6.1f} s  load {loads[-1][0]:.1f}", flush=True)
        for rnd in range(ns.startup_rounds):
            for peer in ["ours", *peers]:
                s = startup(peer, ns, log)
                loads.append(os.getloadavg())
                if s is not None:
                    starts[peer].append(s)
                print(f"# start-up round {rnd + 1} {peer:<5s} " + (f"{s:.2f} s" if s is not None else "FAILED")
                      + f"  load {loads[-1][0]:.1f}", flush=True)
        nodes = two_nodes(ns, log) if ns.two_nodes else None
        if ns.two_nodes:
            print("# two nodes: " + (json.dumps(nodes) if nodes else "FAILED (see log)"), flush=True)
    copy["after"] = {1: copy_bandwidth(1), 2: copy_bandwidth(2)}
    loads.append(os.getloadavg())
    results = {c: summarize(raw[c], c, ns.nproc) for c in colls}
    print()
    for c in colls:
        print("\n".join(table(results[c], c, peers)))
        print()
    print("start-up: seconds from process start to rank 0's first completed all_reduce (median of "
          f"{ns.startup_rounds})\n")
    print("| runner | median | runs |\n|---|---|---|")
    names = {"ours": f"launch --nproc {ns.nproc}", "gloo": f"torchrun --nproc-per-node {ns.nproc} (gloo)",
             "mpi": f"mpirun -np {ns.nproc} (mpi4py)"}
    for peer, vals in starts.items():
        if vals:
            print(f"| {names[peer]} | {statistics.median(vals):.2f} s | {', '.join(f'{v:.2f}' for v in vals)} |")
    print("\nnp.copyto 64 MiB (GB/s): "
          + ", ".join(f"{when}: {v[1]:.2f} (1 proc) / {v[2]:.2f} (2 procs)" for when, v in copy.items()))
    print(f"load average (1 min) during the run: min {min(x[0] for x in loads):.1f}, "
          f"median {statistics.median(x[0] for x in loads):.1f}, max {max(x[0] for x in loads):.1f}; "
          f"wall time {time.time() - t_begin:.0f} s\n")
    print("\n".join(targets(results, starts, nodes)))
    if ns.json_out:
        with open(ns.json_out, "w", encoding="utf-8") as f:
            json.dump({"machine": info, "args": vars(ns), "raw": raw, "summary": results, "startup": starts,
                       "two_nodes": nodes, "copyto_gbs": copy, "loadavg": loads}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
