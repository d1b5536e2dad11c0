"""Warm card actors over many jobs: threads and memory of every card actor before and after N warm jobs.

    python bench/warm_jobs.py                 # 100 jobs of 1 rank (malloc + free), on this process's own session
    python bench/warm_jobs.py --jobs 300 --nproc 4

A warm card is reset between jobs (rt/ray/pool.py); whatever a reset leaves behind grows with the number of
jobs. The regression test (tests/rt/test_warm_threads.py) runs a few jobs; this runs as many as you ask and
prints, per card actor, threads and RSS before and after, and the job rate. Nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def tiny_job():
    import rt
    rt.init()
    rt.set_device(int(os.environ["DEVICE_ID"]))
    rt.free(rt.malloc(4096))
    return 0


def card_processes():
    import psutil
    import ray
    from rt.ray import pool
    with pool._lock:
        actors = [a for group in pool._idle.values() for cards in group for a in cards.actors]
    return [psutil.Process(pid) for pid in ray.get([a.pid.remote() for a in actors], timeout=30)]


def snapshot(procs) -> dict:
    return {p.pid: (p.num_threads(), p.memory_info().rss) for p in procs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--nproc", type=int, default=1)
    args = ap.parse_args(argv)
    import ray
    import launcher
    from rt.config import load_config
    from rt.ray import session
    session.start_local_ray(load_config(None))
    try:
        for _ in range(3):                                   # cold cards, then settle
            launcher.spawn(tiny_job, nproc=args.nproc, timeout=120)
        procs = card_processes()
        before = snapshot(procs)
        t0 = time.perf_counter()
        for _ in range(args.jobs):
            launcher.spawn(tiny_job, nproc=args.nproc, timeout=120)
        elapsed = time.perf_counter() - t0
        time.sleep(1.0)                                      # a reset's last threads finish
        after = snapshot(procs)
        print(f"{args.jobs} warm jobs of {args.nproc} rank(s): {elapsed:.1f} s ({args.jobs / elapsed:.1f} jobs/s)")
        print(f"{'card pid':>10} {'threads before':>15} {'after':>6} {'RSS before MiB':>15} {'after':>7}")
        for pid, (threads, rss) in before.items():
            t2, r2 = after[pid]
            print(f"{pid:>10} {threads:>15} {t2:>6} {rss / 2**20:>15.1f} {r2 / 2**20:>7.1f}")
    finally:
        session.stop_ray()
        if ray.is_initialized():
            ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
