"""What the stream race detector costs: the same runs with NPUSIM_RACE_CHECK=0 and =1, alternating.

    python bench/race_overhead.py                   # 3 rounds: bench/rt_bench.py and examples/train.py
    python bench/race_overhead.py --rounds 5 --backend local

Each round runs, off then on: ``python bench/rt_bench.py --backend B`` (its table: copy bandwidth, enqueue rate,
round trip, malloc/free) and ``launch --nproc N examples/train.py --epochs 2`` (its samples/s line). Reported:
per-measurement medians off / on and the ratio. Each child gets its own embedded Ray session.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import compare  # noqa: E402

ROW = re.compile(r"^(?P<name>\S.*?)\s{2,}(?P<value>[\d.,]+)\s*(?P<unit>[^\s]*)\s{2,}")


def rt_bench(ns, log) -> dict:
    code, out, _ = compare.run_child([sys.executable, os.path.join(ROOT, "bench", "rt_bench.py"), "--backend",
                                      ns.backend], ns.timeout, log)
    rows = {}
    for line in out.splitlines() if code == 0 else []:
        m = ROW.match(line)
        if m and not line.startswith("measurement"):
            rows[m["name"].strip()] = (float(m["value"].replace(",", "")), m["unit"])
    return rows


def train(ns, log) -> float | None:
    code, out, _ = compare.run_child([sys.executable, "-m", "launcher", "--nproc", str(ns.nproc),
                                      os.path.join(ROOT, "examples", "train.py"), "--epochs", "2"], ns.timeout, log)
    m = re.search(r"([\d.]+) samples/s", out)
    return float(m.group(1)) if code == 0 and m else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="race_overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backend", choices=("ray", "local"), default="ray")
    p.add_argument("-p", "--nproc", type=int, default=8)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--log", default="/tmp/npusim-race-overhead.log")
    ns = p.parse_args(argv)
    saved = {k: os.environ.get(k) for k in ("NPUSIM_CLUSTER", "NPUSIM_RACE_CHECK")}
    res = {m: {"bench": [], "train": []} for m in ("off", "on")}
    try:
        with open(ns.log, "a") as log:
            for rnd in range(ns.rounds):
                for mode in ("off", "on"):
                    os.environ["NPUSIM_CLUSTER"] = "0"
                    os.environ["NPUSIM_RACE_CHECK"] = "1" if mode == "on" else "0"
                    res[mode]["bench"].append(rt_bench(ns, log))
                    res[mode]["train"].append(train(ns, log))
                    print(f"round {rnd + 1} {mode}: train {res[mode]['train'][-1]} samples/s", flush=True)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    print(f"\nrace detector off vs on, {ns.rounds} rounds (rt_bench --backend {ns.backend}; train.py on {ns.nproc} ranks)")
    print("| measurement | off | on | on/off |\n|---|---|---|---|")
    names = [n for n in (res["off"]["bench"][0] if res["off"]["bench"] else {})]
    for name in names:
        off = [b[name][0] for b in res["off"]["bench"] if name in b]
        on = [b[name][0] for b in res["on"]["bench"] if name in b]
        if off and on:
            a, b = statistics.median(off), statistics.median(on)
            unit = res["off"]["bench"][0][name][1]
            print(f"| {name} | {a:g} {unit} | {b:g} {unit} | {b / a:.3f} |")
    t_off = [x for x in res["off"]["train"] if x]
    t_on = [x for x in res["on"]["train"] if x]
    if t_off and t_on:
        a, b = statistics.median(t_off), statistics.median(t_on)
        print(f"| train.py samples/s | {a:.0f} | {b:.0f} | {b / a:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
