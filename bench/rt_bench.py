"""rt micro-benchmarks (not a test): copy bandwidth, enqueue rate, round-trip latency, allocator cache.

    python bench/rt_bench.py [--backend ray|local] [--iters N] [--profile NAME]

Prints one table with the issue's targets beside each figure (reported, never asserted):

- H2D / D2H of 64 MiB from pageable (numpy) and pinned (``rt.malloc_host``) memory, GB/s;
- async enqueue rate: empty ``@rt.kernel`` launches per second from one host thread;
- tiny synchronous round trip: enqueue an empty kernel + ``synchronize_stream``, median µs;
- ``malloc`` + ``free`` of 1 MiB, cached vs uncached (``empty_cache`` between, not timed);
- with the Ray backend, a Ray actor no-op call round trip in the same run as the yardstick.

``--profile enqueue|roundtrip|h2d_pageable|...`` runs that one measurement under cProfile and prints
the top functions, to see where the time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rt  # noqa: E402

MiB = 1 << 20
COPY_BYTES = 64 * MiB


@rt.kernel
def empty_kernel(x, out):
    """Does nothing: measures launch overhead only."""


def timed(fn, iters: int) -> list[float]:
    """Wall time of each of ``iters`` calls of ``fn`` (after one warm-up call), in seconds."""
    fn()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


# ---------------------------------------------------------------- measurements
def copy_bandwidth(iters: int) -> dict:
    dev = rt.malloc(COPY_BYTES)
    pageable = np.random.default_rng(0).integers(0, 256, COPY_BYTES, dtype=np.uint8)
    pinned = rt.malloc_host(COPY_BYTES)
    np.frombuffer(pinned, np.uint8)[:] = pageable
    back = np.empty_like(pageable)
    res = {}
    cases = {
        "h2d_pageable": lambda: rt.memcpy(dev, COPY_BYTES, pageable, COPY_BYTES, rt.ACL_MEMCPY_HOST_TO_DEVICE),
        "h2d_pinned": lambda: rt.memcpy(dev, COPY_BYTES, pinned, COPY_BYTES, rt.ACL_MEMCPY_HOST_TO_DEVICE),
        "d2h_pageable": lambda: rt.memcpy(back, COPY_BYTES, dev, COPY_BYTES, rt.ACL_MEMCPY_DEVICE_TO_HOST),
        "d2h_pinned": lambda: rt.memcpy(pinned, COPY_BYTES, dev, COPY_BYTES, rt.ACL_MEMCPY_DEVICE_TO_HOST),
    }
    for name, fn in cases.items():
        res[name] = COPY_BYTES / statistics.median(timed(fn, iters)) / 1e9
    assert np.array_equal(back, pageable)          # the copies did move the bytes
    rt.free_host(pinned)
    rt.free(dev)
    return res


def enqueue_rate(iters: int) -> dict:
    s = rt.create_stream()
    t = rt.empty(4, np.float32)
    n = max(2000, iters * 200)
    rt.launch_kernel(empty_kernel, [t], [t], stream=s)   # registers the kernel on the card
    rt.synchronize_stream(s)
    t0 = time.perf_counter()
    for _ in range(n):
        rt.launch_kernel(empty_kernel, [t], [t], stream=s)
    t1 = time.perf_counter()
    rt.synchronize_stream(s)
    t2 = time.perf_counter()
    rt.destroy_stream(s)
    t.free()
    return {"enqueue_per_s": n / (t1 - t0), "executed_per_s": n / (t2 - t0)}


def round_trip(iters: int) -> dict:
    s = rt.create_stream()
    t = rt.empty(4, np.float32)

    def once():
        rt.launch_kernel(empty_kernel, [t], [t], stream=s)
        rt.synchronize_stream(s)
    lat = timed(once, max(iters * 20, 200))
    rt.destroy_stream(s)
    t.free()
    return {"roundtrip_us": statistics.median(lat) * 1e6}


def malloc_free(iters: int) -> dict:
    n = max(iters * 20, 200)

    def cached():
        rt.free(rt.malloc(MiB))
    cached_s = statistics.median(timed(cached, n))
    uncached = []
    for _ in range(n):
        rt.empty_cache()                                     # not timed: forces a fresh segment
        t0 = time.perf_counter()
        rt.free(rt.malloc(MiB))
        uncached.append(time.perf_counter() - t0)
    return {"malloc_cached_us": cached_s * 1e6, "malloc_uncached_us": statistics.median(uncached) * 1e6}


def ray_noop(iters: int) -> dict:
    import ray

    @ray.remote(num_cpus=0)
    class Noop:
        def ping(self):
            return None

    a = Noop.remote()
    ray.get(a.ping.remote())
    lat = timed(lambda: ray.get(a.ping.remote()), max(iters * 20, 200))
    ray.kill(a)
    return {"ray_noop_us": statistics.median(lat) * 1e6}


MEASUREMENTS = {"copies": copy_bandwidth, "enqueue": enqueue_rate, "roundtrip": round_trip,
                "malloc": malloc_free}


# ---------------------------------------------------------------- report
def report(r: dict, backend: str) -> None:
    rows = [
        ("H2D 64 MiB pageable", f"{r['h2d_pageable']:.2f} GB/s", ""),
        ("H2D 64 MiB pinned", f"{r['h2d_pinned']:.2f} GB/s",
         _verdict(r["h2d_pinned"] >= 2 and r["h2d_pinned"] >= 1.5 * r["h2d_pageable"],
                  f">= 2 GB/s and >= 1.5x pageable (x{r['h2d_pinned'] / r['h2d_pageable']:.2f})")),
        ("D2H 64 MiB pageable", f"{r['d2h_pageable']:.2f} GB/s", ""),
        ("D2H 64 MiB pinned", f"{r['d2h_pinned']:.2f} GB/s", f"x{r['d2h_pinned'] / r['d2h_pageable']:.2f} pageable"),
        ("async enqueue, empty kernel", f"{r['enqueue_per_s']:,.0f} /s",
         _verdict(r["enqueue_per_s"] >= 20_000, ">= 20,000/s")),
        ("  ... enqueue + execute", f"{r['executed_per_s']:,.0f} /s", ""),
        ("enqueue + synchronize (median)", f"{r['roundtrip_us']:.0f} us", _verdict(r["roundtrip_us"] <= 300, "<= 300 us")),
        ("malloc+free 1 MiB, cached", f"{r['malloc_cached_us']:.1f} us", ""),
        ("malloc+free 1 MiB, uncached", f"{r['malloc_uncached_us']:.1f} us",
         _verdict(r["malloc_uncached_us"] >= 10 * r["malloc_cached_us"],
                  f"cached >= 10x faster (x{r['malloc_uncached_us'] / r['malloc_cached_us']:.1f})")),
    ]
    if "ray_noop_us" in r:
        rows.append(("Ray actor no-op call (yardstick)", f"{r['ray_noop_us']:.0f} us", ""))
    print(f"\nrt_bench  backend={backend}  soc={rt.get_soc_name()}  cpus={os.cpu_count()}")
    width = max(len(name) for name, _, _ in rows)
    print(f"{'measurement':<{width}}  {'result':>16}  target")
    print("-" * (width + 50))
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>16}  {target}")


def _verdict(ok: bool, text: str) -> str:
    return f"{'met' if ok else 'MISSED'}: {text}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("ray", "local"), default="ray")
    p.add_argument("--iters", type=int, default=10, help="repetitions per measurement (scaled up for tiny ones)")
    p.add_argument("--profile", choices=sorted(MEASUREMENTS), help="run one measurement under cProfile")
    args = p.parse_args(argv)
    rt.init(backend=args.backend)
    try:
        rt.set_device(0)
        if args.profile:
            prof = cProfile.Profile()
            prof.runcall(MEASUREMENTS[args.profile], args.iters)
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)
            return 0
        results = {}
        for fn in MEASUREMENTS.values():
            results.update(fn(args.iters))
        if args.backend == "ray":
            results.update(ray_noop(args.iters))
        report(results, args.backend)
        rt.reset_device(0)
    finally:
        rt.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
