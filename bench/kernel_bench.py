"""Kernel and model benchmark (not a test): eager MatMul on a card vs numpy in-process, and model
execute latency of the examples/mdl_infer.py MLP.

    python bench/kernel_bench.py [--backend ray|local] [--iters 20]

Eager MatMul 1024×1024 fp32: one iteration is ``rt.ops.matmul(a, b)`` + ``synchronize_stream`` (output
freed afterwards), so it includes the enqueue, the card-side numpy matmul, the allocation and the sync
round trip; the overhead ratio is that over ``a @ b`` in this process. Model execute: synchronous
``mdl.execute`` of the 64→128→10 MLP at batch 8, median µs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import rt  # noqa: E402
from rt import mdl  # noqa: E402


def median_us(fn, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="ray", choices=["ray", "local"])
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((1024, 1024), dtype=np.float32)
    b_np = rng.standard_normal((1024, 1024), dtype=np.float32)
    numpy_us = median_us(lambda: a_np @ b_np, args.iters)

    rt.init(backend=args.backend)
    rt.set_device(0)
    a, b = rt.Tensor.from_numpy(a_np), rt.Tensor.from_numpy(b_np)

    def eager():
        c = rt.ops.matmul(a, b)
        rt.synchronize_stream(None)
        c.free()
    card_us = median_us(eager, args.iters)
    check = rt.ops.matmul(a, b).numpy()
    ok = np.allclose(check, a_np @ b_np, rtol=1e-4, atol=1e-3)

    import mdl_infer
    with tempfile.TemporaryDirectory(prefix="npusim-bench-") as tmp:
        path = os.path.join(tmp, "mlp.om")
        weights = mdl_infer.build(path, rng)
        model = mdl.load_from_file(path)
        desc = mdl.get_desc(model)
        x = rng.standard_normal((8, 64)).astype(np.float32)
        xin = rt.Tensor.from_numpy(x)
        out = rt.empty((8, 10), np.float32)
        ins, outs = mdl.create_dataset(), mdl.create_dataset()
        mdl.add_dataset_buffer(ins, rt.create_data_buffer(xin.ptr, xin.nbytes))
        mdl.add_dataset_buffer(outs, rt.create_data_buffer(out.ptr, mdl.get_output_size_by_index(desc, 0)))
        mdl.set_dynamic_batch_size(model, ins, 0, 8)
        exec_us = median_us(lambda: mdl.execute(model, ins, outs), args.iters)
        probs = out.numpy()
        model_ok = np.allclose(probs, mdl_infer.reference(x, weights), rtol=1e-4, atol=1e-5)
        mdl.unload(model)
    rt.reset_device(0)
    rt.finalize()

    print(f"# kernel benchmark, backend={args.backend}, median of {args.iters}")
    print(f"{'measurement':<44}{'value':>14}")
    print(f"{'numpy a @ b (1024x1024 fp32, in process)':<44}{numpy_us:>11.0f} us")
    print(f"{'rt.ops.matmul on a card + synchronize':<44}{card_us:>11.0f} us   (correct: {ok})")
    print(f"{'overhead ratio card / numpy':<44}{card_us / numpy_us:>13.2f}x")
    print(f"{'mdl.execute MLP 64-128-10, batch 8':<44}{exec_us:>11.0f} us   (correct: {model_ok})")


if __name__ == "__main__":
    main()
