"""Where a cold ``launch --nproc N`` spends its seconds: one traced launch of ``bench/peers/hccl_first.py``.

    python bench/startup_trace.py [--nproc 8] [--load 2] [-- launch options]

Runs ``launch`` in this process (so the time it takes to import launch itself counts) and prints, in seconds
after this process started: the launch imports, ``ray.init`` and the start of each of Ray's processes (GCS,
raylet, agents), the card actors requested, each card process started and each card serving, the fork server
ready, the ranks forked, and each rank's imports done, communicator made and first all_reduce done (the ranks
write these to the directory ``NPUSIM_STARTUP_TRACE`` names: ``bench/peers/hccl_first.py``). ``--load K`` runs K busy
processes beside it (started and stopped here). Nothing of the product is changed: the phases are read by
wrapping its functions from outside.
"""

from __future__ import annotations

import time

T0 = time.time()

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVENTS: list[tuple[float, str]] = []
_lock = threading.Lock()


def mark(what: str, when: float | None = None) -> None:
    with _lock:
        EVENTS.append(((time.time() if when is None else when) - T0, what))


def _psutil_offset() -> float:
    """What to add to psutil's process start times to get this clock's: they count from the boot time, which
    Linux gives in whole seconds (off by up to 1 s). Measured on a child started now."""
    import psutil
    before = time.time()
    child = subprocess.Popen(["sleep", "5"])
    after = time.time()
    try:
        return (before + after) / 2 - psutil.Process(child.pid).create_time()
    finally:
        child.kill()
        child.wait(timeout=10)


def started(pid: int) -> float:
    """Unix time process ``pid`` started (psutil, corrected by _psutil_offset)."""
    import psutil
    return psutil.Process(pid).create_time() + OFFSET[0]


OFFSET = [0.0]


def _wrap(owner, name: str, label: str) -> None:
    original = getattr(owner, name)

    def wrapped(*a, **kw):
        mark(f"{label} begins")
        try:
            return original(*a, **kw)
        finally:
            mark(f"{label} returns")
    setattr(owner, name, wrapped)


def _ray_processes(ray) -> None:
    """Start times of the session's processes (GCS, raylet, agents...), from psutil."""
    import psutil
    node = getattr(ray._private.worker, "_global_node", None)
    for kind, infos in (getattr(node, "all_processes", None) or {}).items():
        for info in infos:
            pid = getattr(getattr(info, "process", None), "pid", None)
            if pid is None:
                continue
            try:
                mark(f"  ray process {kind} started", started(pid))
                for child in psutil.Process(pid).children(recursive=True):
                    mark(f"  ray process {kind} child {child.name()[:30]} started", started(child.pid))
            except psutil.Error:
                pass


def _watch_cards(ray, cards) -> None:
    """Mark each card actor's readiness as it comes (a thread beside launch's own wait)."""
    pending = dict(cards.pending)

    def run():
        left = dict(pending)
        while left:
            ready, _ = ray.wait(list(left), num_returns=1, timeout=120)
            if not ready:
                return
            for ref in ready:
                mark(f"cards {list(left.pop(ref))} serve")
    threading.Thread(target=run, daemon=True).start()


def instrument() -> None:
    mark("launch imports begin")
    import ray

    from launcher.agent import node_agent
    from launcher.forkserver import client
    from launcher.launch import cli  # noqa: F401 - what `launch` imports first
    from rt.ray import session
    mark("launch imports done (ray imported)")
    start_local = session.start_local_ray

    def start_local_ray(*a, **kw):
        mark("ray.init begins")
        try:
            return start_local(*a, **kw)
        finally:
            mark("ray.init returns")
            _ray_processes(ray)
    session.start_local_ray = start_local_ray
    create = session.create_cards

    def create_cards(*a, **kw):
        mark("card actors requested")
        cards = create(*a, **kw)
        mark(f"{len(cards.actors)} card actor(s) created (calls returned)")
        _watch_cards(ray, cards)
        return cards
    session.create_cards = create_cards
    wait = session.wait_cards

    def wait_cards(cards, *a, **kw):
        out = wait(cards, *a, **kw)
        mark("launch: all cards serve")
        for actor in cards.actors:
            pid = ray.get(actor.pid.remote(), timeout=10)
            mark(f"  card process {pid} started", started(pid))
        return out
    session.wait_cards = wait_cards
    _wrap(client.ForkServer, "__init__", "fork server start")
    _wrap(node_agent.NodeAgent, "start", "ranks forked (agent.start)")


def busy(k: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=8)
    p.add_argument("--load", type=int, default=0, help="busy processes running beside the launch")
    p.add_argument("rest", nargs="*", help="more launch options (after --)")
    ns = p.parse_args()
    OFFSET[0] = _psutil_offset()
    loaders = busy(ns.load)
    try:
        os.environ["NPUSIM_STARTUP_TRACE"] = trace_dir = tempfile.mkdtemp(prefix="npusim-startup-")
        sys.path.insert(0, ROOT)
        instrument()
        from launcher.launch import cli
        code = cli.main(["--nproc", str(ns.nproc), *ns.rest, os.path.join(ROOT, "bench", "peers", "hccl_first.py")])
        mark(f"launch returns ({code})")
        for name in sorted(os.listdir(trace_dir)):
            with open(os.path.join(trace_dir, name), encoding="utf-8") as f:
                for line in f:
                    rank, what, when = line.split()
                    mark(f"rank {rank}: {what}", float(when) + (OFFSET[0] if what == "started" else 0.0))
        shutil.rmtree(trace_dir, ignore_errors=True)
    finally:
        for proc in loaders:
            proc.kill()
            proc.wait(timeout=10)
    print(f"load average {os.getloadavg()[0]:.2f}; busy processes beside: {ns.load}")
    for t, what in sorted(EVENTS):
        print(f"{t:7.3f}  {what}")
    return code


if __name__ == "__main__":
    sys.exit(main())
