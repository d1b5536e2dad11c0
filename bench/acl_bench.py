"""The pyACL facade's cost per call (not a test): ``acl.rt.memcpy`` of 4 KiB host→device through the facade
against ``rt.memcpy`` of the same copy, from a numpy array and from pinned memory, plus a few other calls.

    python bench/acl_bench.py [--backend ray|local] [--iters N]

The facade's work is host-side Python (int address → registered buffer, kind inference, the ret
convention), so the difference between the two columns is what a pyACL program pays over npusim's own
API. Medians of N calls after a warm-up; reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import acl  # noqa: E402
import rt  # noqa: E402

N = 4096


def median_us(fn, iters: int) -> float:
    fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="ray", choices=["ray", "local"])
    p.add_argument("--iters", type=int, default=2000)
    a = p.parse_args()
    os.environ["NPUSIM_BACKEND"] = a.backend
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    dev, ret = acl.rt.malloc(N, 0)
    src = np.random.default_rng(0).integers(0, 256, N, dtype=np.uint8)
    src_ptr = acl.util.numpy_to_ptr(src)
    pinned_ptr, ret = acl.rt.malloc_host(N)
    pinned_buf = rt.malloc_host(N)
    H2D = rt.ACL_MEMCPY_HOST_TO_DEVICE

    rows = [
        ("memcpy 4 KiB H2D from numpy", lambda: acl.rt.memcpy(dev, N, src_ptr, N, 1),
         lambda: rt.memcpy(dev, N, src, N, H2D)),
        ("memcpy 4 KiB H2D from pinned", lambda: acl.rt.memcpy(dev, N, pinned_ptr, N, 1),
         lambda: rt.memcpy(dev, N, pinned_buf, N, H2D)),
        ("memset 4 KiB device", lambda: acl.rt.memset(dev, N, 0, N), lambda: rt.memset(dev, N, 0, N)),
        ("get_device", lambda: acl.rt.get_device(), lambda: rt.get_device()),
        ("util.numpy_to_ptr", lambda: acl.util.numpy_to_ptr(src), None),
    ]
    print(f"backend {a.backend}, {a.iters} calls each, median µs per call")
    print(f"{'call':34} {'acl facade':>11} {'rt':>9} {'overhead':>9}")
    for name, facade, direct in rows:
        f_us = median_us(facade, a.iters)
        if direct is None:
            print(f"{name:34} {f_us:11.1f} {'-':>9} {'-':>9}")
            continue
        d_us = median_us(direct, a.iters)
        print(f"{name:34} {f_us:11.1f} {d_us:9.1f} {f_us - d_us:+9.1f}")
    rt.free_host(pinned_buf)
    assert acl.rt.free_host(pinned_ptr) == 0 and acl.rt.free(dev) == 0
    assert acl.rt.reset_device(0) == 0 and acl.finalize() == 0


if __name__ == "__main__":
    main()
