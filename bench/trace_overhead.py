"""What the always-on flight recorder costs: the same runs with it on (default) and off (size 0), alternating.

    python bench/trace_overhead.py                  # 3 rounds: hccl-test all_reduce 1K..1M, train.py samples/s
    python bench/trace_overhead.py --rounds 5 --json-out /tmp/trace_overhead.json

Each round runs, in this order, with ``NPUSIM_TRACE_BUFFER_SIZE=0`` then unset (the default ring):
  ``hccl-test all_reduce -p 8 -b 1K -e 1M -f 4 -n 20 -w 5 --json`` (the sweep of ``compare.py --quick``) and
  ``launch --nproc 8 examples/train.py --epochs 2`` (its final samples/s line).
Reported: per-size median time off / on and the overhead (on/off - 1), and train samples/s off / on.
Each child runs on its own embedded Ray session (``NPUSIM_CLUSTER=0``), like a user's run.

Then, ``--paired-rounds`` times (default 2), the paired measure: ``launch --nproc 8 bench/peers/trace_paired.py``
per ``--paired-sizes`` size, which switches the recorder off and on every 25 calls inside one job, so both see the
same processes and the same load (separate runs differ by more than the recorder costs). Reported: the median
over ranks and rounds of each rank's median wall and CPU time per call, off and on.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import compare  # noqa: E402  (run_child: process-group handling, timeouts)


def with_env(on: bool):
    os.environ["NPUSIM_CLUSTER"] = "0"
    if on:
        os.environ.pop("NPUSIM_TRACE_BUFFER_SIZE", None)
    else:
        os.environ["NPUSIM_TRACE_BUFFER_SIZE"] = "0"


def sweep(ns, log) -> dict | None:
    cmd = [sys.executable, "-m", "launcher.tools.hccl_test", "all_reduce", "-p", str(ns.nproc), "-b", "1K", "-e", "1M",
           "-f", "4", "-n", str(ns.iters), "-w", "5", "-c", "1", "--json"]
    code, out, _ = compare.run_child(cmd, ns.timeout, log)
    if code != 0:
        return None
    rows = json.loads(out)["rows"]
    return {r["size"]: (r["out_of_place"] or r["in_place"])["time_us"] for r in rows}


def train(ns, log) -> float | None:
    cmd = [sys.executable, "-m", "launcher", "--nproc", str(ns.nproc), os.path.join(ROOT, "examples", "train.py"),
           "--epochs", str(ns.epochs)]
    code, out, _ = compare.run_child(cmd, ns.timeout, log)
    m = re.search(r"([\d.]+) samples/s", out)
    return float(m.group(1)) if code == 0 and m else None


def paired(ns, size: int, log) -> list[dict] | None:
    """Every rank's ``TRACE_PAIRED`` record of one ``trace_paired.py`` job (None: it failed; the log says why)."""
    cmd = [sys.executable, "-m", "launcher", "--nproc", str(ns.nproc), os.path.join(ROOT, "bench", "peers",
                                                                                     "trace_paired.py"),
           "--bytes", str(size)]
    code, out, _ = compare.run_child(cmd, ns.timeout, log)
    rows = [json.loads(line.split("TRACE_PAIRED ", 1)[1]) for line in out.splitlines() if "TRACE_PAIRED " in line]
    return rows if code == 0 and len(rows) == ns.nproc else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="trace_overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-p", "--nproc", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--log", default="/tmp/npusim-trace-overhead.log")
    p.add_argument("--json-out", default=None)
    p.add_argument("--paired-rounds", type=int, default=2, help="jobs per size of the paired measure (0: none)")
    p.add_argument("--paired-sizes", default="1K,64K")
    ns = p.parse_args(argv)
    saved = {k: os.environ.get(k) for k in ("NPUSIM_CLUSTER", "NPUSIM_TRACE_BUFFER_SIZE")}
    res = {"off": {"sweep": [], "train": []}, "on": {"sweep": [], "train": []}}
    pairs: dict[str, list] = {}
    try:
        with open(ns.log, "a") as log:
            for rnd in range(ns.rounds):
                for mode in ("off", "on"):
                    with_env(mode == "on")
                    res[mode]["sweep"].append(sweep(ns, log))
                    res[mode]["train"].append(train(ns, log))
                    print(f"round {rnd + 1} {mode}: train {res[mode]['train'][-1]} samples/s", flush=True)
            with_env(True)              # the paired jobs switch the recorder themselves
            for rnd in range(ns.paired_rounds):
                for size in ns.paired_sizes.split(","):
                    rows = paired(ns, compare.parse_size(size), log)
                    pairs.setdefault(size, []).extend(rows or [])
                    print(f"paired round {rnd + 1} {size}: {'ok' if rows else 'failed (see ' + ns.log + ')'}",
                          flush=True)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    print(f"\nflight recorder off (NPUSIM_TRACE_BUFFER_SIZE=0) vs on (default), {ns.rounds} rounds, {ns.nproc} ranks")
    print("| size | off | on | overhead |\n|---|---|---|---|")
    sizes = sorted({s for mode in res.values() for sw in mode["sweep"] if sw for s in sw}, key=int)
    summary = {}
    for size in sizes:
        off = statistics.median([sw[size] for sw in res["off"]["sweep"] if sw and size in sw])
        on = statistics.median([sw[size] for sw in res["on"]["sweep"] if sw and size in sw])
        summary[size] = (off, on)
        print(f"| {compare.human(int(size))} | {off:.0f} µs | {on:.0f} µs | {100 * (on / off - 1):+.1f}% |")
    t_off = [x for x in res["off"]["train"] if x]
    t_on = [x for x in res["on"]["train"] if x]
    if t_off and t_on:
        a, b = statistics.median(t_off), statistics.median(t_on)
        print(f"| train.py samples/s | {a:.0f} | {b:.0f} | {100 * (a / b - 1):+.1f}% (time) |")
    if pairs:
        print(f"\npaired: the recorder off and on every 25 calls in one job ({ns.paired_rounds} jobs per size; "
              f"median over ranks of each rank's median per call)")
        print("| size | wall off | wall on | overhead | CPU off | CPU on | overhead |\n|---|---|---|---|---|---|---|")
        for size, rows in pairs.items():
            if not rows:
                continue
            m = {k: statistics.median(r[k] for r in rows) for k in ("wall_off_us", "wall_on_us", "cpu_off_us",
                                                                   "cpu_on_us")}
            print(f"| {size} | {m['wall_off_us']:.0f} µs | {m['wall_on_us']:.0f} µs | "
                  f"{100 * (m['wall_on_us'] / m['wall_off_us'] - 1):+.1f}% | {m['cpu_off_us']:.1f} µs | "
                  f"{m['cpu_on_us']:.1f} µs | {100 * (m['cpu_on_us'] / m['cpu_off_us'] - 1):+.1f}% |")
    if ns.json_out:
        with open(ns.json_out, "w") as f:
            json.dump({"raw": res, "sweep_median": summary, "paired": pairs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
