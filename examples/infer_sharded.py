"""Sharded inference: a model larger than one card's HBM, split Megatron-style over 4 cards.

    launch --nproc 4 --config small examples/infer_sharded.py      # one process per rank
    python examples/infer_sharded.py                                 # one process driving 4 cards

With ``configs/small.toml`` every card has 64 MiB of HBM. The model is an MLP whose two weight
matrices together hold about 1.1x that (1024 -> 9216 -> 1024, 72 MiB of float32):

1. loading it on one card fails with ACL_ERROR_RT_MEMORY_ALLOCATION (207001);
2. ``hccl.load_sharded(data, comm, mode="tensor")`` splits the first Gemm by columns and
   the second MatMul by rows (an all-reduce joins them), so each card holds ~18 MiB; the output
   equals the numpy reference;
3. the same API with ``mode="batch"`` runs a small model data-parallel: each card a full copy
   and a slice of the batch, outputs all-gathered.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hccl  # noqa: E402
import rt  # noqa: E402
from rt import mdl  # noqa: E402
from hccl import load_sharded  # noqa: E402

WORLD = 4


def build_mlp(seed: int, d: int, hidden: int):
    """Model bytes of Gemm(+bias) → Relu → MatMul, and its float64 numpy reference."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((d, hidden), dtype=np.float32) * np.float32(1 / np.sqrt(d))
    b1 = rng.standard_normal(hidden, dtype=np.float32) * np.float32(0.1)
    w2 = rng.standard_normal((hidden, d), dtype=np.float32) * np.float32(1 / np.sqrt(hidden))
    g = mdl.GraphBuilder(f"mlp_{d}x{hidden}")
    x = g.input("x", "float32", [-1, d])
    h = g.op("Relu", [g.op("Gemm", [x, g.constant("w1", w1), g.constant("b1", b1)])])
    g.output("y", g.op("MatMul", [h, g.constant("w2", w2)]))

    def reference(xv):
        return np.maximum(xv.astype(np.float64) @ w1 + b1, 0) @ w2
    return g.serialize(), reference


def setup():
    """(communicators driven by this process, rank of the first, say-function)."""
    if "WORLD_SIZE" in os.environ:
        comm = hccl.init()
        if comm.size != WORLD:
            raise SystemExit(f"run with --nproc {WORLD} (got a world of {comm.size})")
        return [comm], comm.rank
    rt.init(config=os.environ.get("NPUSIM_CONFIG", "small"))
    return hccl.comm_init_all(list(range(WORLD))), 0


def main() -> None:
    comms, rank = setup()
    say = print if rank == 0 else (lambda *a, **k: None)
    capacity = rt.get_device_info(comms[0].device).total_memory
    if capacity > 256 << 20:
        raise SystemExit(f"cards have {capacity >> 20} MiB of HBM; run with --config small (64 MiB cards) so the "
                         f"model does not fit one card")
    d, hidden = 1024, 9216 * capacity // (64 << 20)
    data, reference = build_mlp(0, d, hidden)
    weight_mib = (2 * d * hidden + hidden) * 4 / (1 << 20)
    say(f"model: {d} -> {hidden} -> {d} MLP, {weight_mib:.1f} MiB of weights; cards have {capacity >> 20} MiB of HBM")

    # 1. one card is not enough
    rt.set_context(comms[0].ctx)
    try:
        mdl.unload(mdl.load_from_mem(data))
        raise SystemExit("the model unexpectedly fit on one card")
    except rt.AclError as e:
        if e.code != rt.ACL_ERROR_RT_MEMORY_ALLOCATION:
            raise
        say(f"load on one card: AclError {e.code} (ACL_ERROR_RT_MEMORY_ALLOCATION) as expected")

    # 2. tensor-sharded over the communicator
    x = np.random.default_rng(1).standard_normal((8, d), dtype=np.float32)
    with load_sharded(data, comms, mode="tensor") as model:
        per_card = ", ".join(f"rank {r}: {b / (1 << 20):.1f} MiB" for r, b in sorted(model.weight_bytes.items()))
        say(f"tensor-sharded over {WORLD} cards: {', '.join(model.plans[rank].sharded)}; weights {per_card}")
        t0 = time.perf_counter()
        (y,) = model.execute([x])
        ms = (time.perf_counter() - t0) * 1000
    err = float(np.abs(y - reference(x)).max())
    say(f"tensor-sharded output {list(y.shape)} in {ms:.0f} ms, max |error| vs numpy {err:.2e}")
    if err > 1e-3:
        raise SystemExit(f"rank {rank}: sharded output differs from the numpy reference by {err}")

    # 3. batch-sharded: a full copy per card, a slice of the batch each
    small, small_ref = build_mlp(2, 64, 256)
    xs = np.random.default_rng(3).standard_normal((10, 64), dtype=np.float32)
    with load_sharded(small, comms, mode="batch") as model:
        (ys,) = model.execute([xs])
    err = float(np.abs(ys - small_ref(xs)).max())
    say(f"batch-sharded: batch of {len(xs)} over {WORLD} cards -> output {list(ys.shape)}, max |error| {err:.2e}")
    if err > 1e-3:
        raise SystemExit(f"rank {rank}: batch-sharded output differs from the numpy reference by {err}")
    for comm in comms:
        hccl.comm_destroy(comm)


if __name__ == "__main__":
    main()
