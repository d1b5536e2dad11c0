"""Data-parallel training benchmark: samples/s of examples/train.py on 1, 2, 4, 8 cards, and how a
step splits into gradient all-reduce vs compute, with and without gradient bucketing.

    python bench/train_bench.py                       # 1 2 4 8 cards x 3 gradient-sync variants
    python bench/train_bench.py --cards 1 8 --epochs 2 --variants bucketed per-tensor

Every run is ``python -m launcher --nproc N examples/train.py ...`` in a subprocess (so 1 card is
measured the same way as 8: rank processes talking to card actors), and the numbers are parsed
from rank 0's output:

- samples/s: the training loop's own figure (``done: ...`` line; excludes start-up);
- a profile of ``--profile-steps`` extra steps, each synchronised: median wall ms per step and the
  card-measured ms of the gradient all-reduce inside it (events on the communication stream, so it
  includes waiting for the slowest rank); compute = step − all-reduce.

Variants: ``bucketed`` (DDP default: 25 MiB buckets — this model's 102 KiB of gradients fit in one),
``small-buckets`` (--bucket-mb 0.03: four buckets, each launched as soon as its gradients exist),
``per-tensor`` (--no-bucketing: one all_reduce + scale per gradient tensor, six per step).

This is a report, not a test: on a 2-core laptop 8 ranks plus 8 card actors share two CPUs, so
more cards mean less compute per process but more processes per core; expect flat or falling
samples/s beyond 2 cards here, and read the all-reduce column for the cost of synchronisation.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {"bucketed": [], "small-buckets": ["--bucket-mb", "0.03"], "per-tensor": ["--no-bucketing"]}
DONE = re.compile(r"done: .* in ([\d.]+) s .*?, (\d+) samples/s")
PROFILE = re.compile(r"median step ([\d.]+) ms, all_reduce ([\d.]+) ms, compute\+launch ([\d.-]+) ms")


def run_one(cards: int, variant: str, args, env) -> dict:
    cmd = [sys.executable, "-m", "launcher", "--nproc", str(cards), "--local-ranks-filter", "0",
           os.path.join(ROOT, "examples", "train.py"), "--epochs", str(args.epochs),
           "--profile-steps", str(args.profile_steps), "--batch-size", str(args.batch_size), *VARIANTS[variant]]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
    total = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    done, prof = DONE.search(out), PROFILE.search(out)
    if proc.returncode != 0 or not done or not prof:
        raise SystemExit(f"{cards} cards / {variant}: launcher exited {proc.returncode}\n{out[-2000:]}")
    return {"cards": cards, "variant": variant, "train_s": float(done.group(1)), "samples_s": int(done.group(2)),
            "step_ms": float(prof.group(1)), "allreduce_ms": float(prof.group(2)),
            "compute_ms": float(prof.group(3)), "wall_s": total}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cards", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--profile-steps", type=int, default=30)
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args(argv)
    # A private Ray temp dir: a bare ray.init() joins any Ray cluster already running on this
    # machine (it reads <tmp>/ray/ray_current_cluster), which would skew or break the runs.
    ray_tmp = tempfile.mkdtemp(prefix="rb", dir="/tmp")
    env = dict(os.environ, RAY_TMPDIR=ray_tmp)
    rows = []
    try:
        print(f"examples/train.py, {args.epochs} epochs, global batch {args.batch_size}, "
              f"{os.cpu_count()} CPUs; profile = median of {args.profile_steps} synchronised steps")
        header = (f"{'cards':>5} {'variant':<14} {'samples/s':>9} {'vs 1 card':>9} {'step ms':>8} "
                  f"{'all_reduce ms':>13} {'compute ms':>10} {'comm %':>6} {'launch s':>8}")
        print(header)
        print("-" * len(header))
        base: dict[str, int] = {}
        for variant in args.variants:
            for cards in args.cards:
                r = run_one(cards, variant, args, env)
                rows.append(r)
                base.setdefault(variant, r["samples_s"])
                share = 100 * r["allreduce_ms"] / r["step_ms"] if r["step_ms"] else 0.0
                print(f"{cards:>5} {variant:<14} {r['samples_s']:>9} {r['samples_s'] / base[variant]:>8.2f}x "
                      f"{r['step_ms']:>8.2f} {r['allreduce_ms']:>13.2f} {r['compute_ms']:>10.2f} {share:>5.0f}% "
                      f"{r['wall_s']:>8.1f}", flush=True)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
