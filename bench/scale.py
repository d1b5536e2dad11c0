"""Large worlds on this machine: start-up, a 1 KiB all_reduce and memory as the world grows (issue #25).

    python bench/scale.py                                   # 8, 16, 32, 64 ranks: simulated nodes of 8 cards
    python bench/scale.py --worlds 64,128,256 --big 64M     # also one 64 MiB all_reduce, checked
    python bench/scale.py --worlds 32,64 --peers gloo       # torchrun + gloo at the same sizes (real data peer)
    python bench/scale.py --json-out /tmp/scale.json

Ours: ``launch --nnodes W/8 --nproc 8 bench/peers/hccl_scale.py`` — W/8 simulated nodes on the embedded
session (one node when W <= --nproc), every rank's first 1 KiB all_reduce, then ``--iters`` timed ones.
Gloo: ``torchrun --nproc-per-node W bench/peers/gloo_allreduce.py all_reduce`` (start-up with --first-only, then
the 1 KiB sweep point). Reported per world: seconds from process start to rank 0's first completed all_reduce,
wall time to exit, the 1 KiB all_reduce (rank 0's median, and the slowest rank's median), the big
all_reduce's time and wrong elements, and the peak of the machine's memory in use (processes' and /dev/shm's,
where card memory lives) above the idle baseline (sampled every 0.2 s: what the whole job — Ray, cards, ranks —
adds). With ``--big`` each rank holds the big tensor only on its card: it writes and checks it a MiB at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import compare  # run_child: process-group handling, timeouts; torchrun
from peers.common import parse_size

PEERS_DIR = os.path.join(ROOT, "bench", "peers")


def _in_use() -> int:
    """The machine's memory in use: total - available (psutil's ``used`` on Linux), which counts /dev/shm too —
    the cards' memory — since shared memory is not reclaimable."""
    vm = psutil.virtual_memory()
    return vm.total - vm.available


class PeakMemory:
    """The machine's memory in use above the baseline taken at start, its peak over the sampled span."""

    def __init__(self, every: float = 0.2):
        self.base = _in_use()
        self.peak, self._every, self._stop = 0, every, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.peak = max(self.peak, _in_use() - self.base)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)


def ours(world: int, ns, log) -> dict:
    nnodes, nproc = (world // ns.nproc, ns.nproc) if world > ns.nproc else (1, world)
    if nnodes * nproc != world:
        raise SystemExit(f"scale: world {world} is not a multiple of --nproc {ns.nproc}")
    cmd = [sys.executable, "-m", "launcher", "--nnodes", str(nnodes), "--nproc", str(nproc)]
    if nproc > 8:
        cmd += ["--config", _config(nproc)]
    cmd += [os.path.join(PEERS_DIR, "hccl_scale.py"), "--iters", str(ns.iters), "--sync", ns.sync]
    if ns.big:
        cmd += ["--big", str(ns.big)]
    with PeakMemory() as mem:
        code, out, start = compare.run_child(cmd, ns.timeout, log)
        end = time.time()
    first = re.search(r"FIRST_COLLECTIVE (\d+\.\d+)", out)
    result = re.search(r"SCALE_RESULT (\{.*\})", out)
    row = {"runner": "ours", "world": world, "nodes": nnodes, "sync": ns.sync, "exit": code, "wall_s": end - start,
           "startup_s": float(first.group(1)) - start if first else None, "peak_mem_gib": mem.peak / 2**30}
    if result:
        row.update(json.loads(result.group(1)))
    return row


def _config(cards: int) -> str:
    """A hardware config with ``cards`` cards on the node (the shipped ones have 8)."""
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"npusim-scale-{cards}.toml")
    with open(path, "w") as f:
        f.write(f"[node]\ncards = {cards}\n")
    return path


def gloo(world: int, ns, log) -> dict:
    script = os.path.join(PEERS_DIR, "gloo_allreduce.py")
    row = {"runner": "gloo", "world": world, "nodes": 1}
    with PeakMemory() as mem:
        code, out, start = compare.run_child([*compare.torchrun(), "--nproc-per-node", str(world), script,
                                              "all_reduce", "--first-only"], ns.timeout, log, scratch=True)
    first = re.search(r"FIRST_COLLECTIVE (\d+\.\d+)", out)
    row.update(exit=code, startup_s=float(first.group(1)) - start if first else None, peak_mem_gib=mem.peak / 2**30)
    code, out, _ = compare.run_child([*compare.torchrun(), "--nproc-per-node", str(world), script, "all_reduce",
                                      "-b", "1K", "-e", "1K", "-n", str(ns.iters), "-w", "5"], ns.timeout, log,
                                     scratch=True)
    m = re.search(r"PEER_RESULT (\{.*\})", out)
    if code == 0 and m:
        rows = json.loads(m.group(1)).get("rows", [])
        if rows:
            row["allreduce_1k_us_max_rank"] = rows[0].get("time_us")
    return row


def show(rows: list[dict]) -> None:
    def f(v, fmt):
        return "—" if v is None else format(v, fmt)
    print("\n| runner | ranks | nodes | start → first all_reduce | wall | 1 KiB all_reduce (rank 0 / slowest) "
          "| big all_reduce | peak memory |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        big = (f"{r['big_bytes'] >> 20} MiB {r['big_s'] * 1e3:.0f} ms, {r['big_wrong']} wrong"
               if "big_bytes" in r else "—")
        ok = "" if r.get("exit") == 0 else f" (exit {r.get('exit')})"
        runner = r["runner"] + (f" ({r['sync']} sync)" if "sync" in r else "")
        print(f"| {runner}{ok} | {r['world']} | {r['nodes']} | {f(r.get('startup_s'), '.1f')} s "
              f"| {f(r.get('wall_s'), '.1f')} s | {f(r.get('allreduce_1k_us'), '.0f')} / "
              f"{f(r.get('allreduce_1k_us_max_rank'), '.0f')} µs | {big} | {f(r.get('peak_mem_gib'), '.2f')} GiB |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", default="8,16,32,64", help="comma-separated world sizes")
    p.add_argument("--nproc", type=int, default=8, help="cards (ranks) per simulated node")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--big", type=parse_size, default=0, help="bytes of one checked all_reduce, e.g. 64M")
    p.add_argument("--sync", choices=("stream", "device"), default="stream",
                   help="how our ranks wait for each call: synchronize_stream (HCCL's samples) or synchronize_device")
    p.add_argument("--peers", default="", help="'gloo' to run torchrun + gloo at the same world sizes")
    p.add_argument("--timeout", type=float, default=1200, help="per child process, seconds")
    p.add_argument("--log", default="/tmp/npusim-scale.log", help="children's stderr and commands")
    p.add_argument("--json-out", default=None)
    ns = p.parse_args()
    rows = []
    with open(ns.log, "w") as log:
        for world in [int(w) for w in ns.worlds.split(",") if w]:
            rows.append(ours(world, ns, log))
            print(f"# ours {world}: {json.dumps(rows[-1])}", flush=True)
            if "gloo" in ns.peers.split(","):
                rows.append(gloo(world, ns, log))
                print(f"# gloo {world}: {json.dumps(rows[-1])}", flush=True)
    show(rows)
    print(f"\nload average (1 min) at the end: {os.getloadavg()[0]:.1f}; children's stderr: {ns.log}")
    if ns.json_out:
        with open(ns.json_out, "w") as f:
            json.dump({"args": vars(ns), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
