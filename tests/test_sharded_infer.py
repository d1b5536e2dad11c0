"""Sharded inference (hccl.sharding): tensor- and batch-sharded models equal the unsharded model and
a numpy oracle; a model larger than one card's HBM fails on one card (207001) and runs over four."""

from __future__ import annotations

import numpy as np
import pytest

from hccl.sharding import Collective, load_sharded, plan_tensor
from rt.mdl import GraphBuilder


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def mlp(rng, d_in=16, hidden=48, d_out=12, gears=None, scale=0.3, batch=-1):
    """x → Gemm(+b1) → Relu → MatMul → Add(b2) → Tanh → Gemm(transB, +b3) → Softmax, also exporting
    the first hidden activation (a column-sharded value: needs the all-gather path)."""
    w = {"w1": rng.standard_normal((d_in, hidden)) * scale, "b1": rng.standard_normal(hidden) * scale,
         "w2": rng.standard_normal((hidden, hidden)) * scale, "b2": rng.standard_normal(hidden) * scale,
         "w3t": rng.standard_normal((d_out, hidden)) * scale, "b3": rng.standard_normal(d_out) * scale}
    w = {k: v.astype(np.float32) for k, v in w.items()}
    g = GraphBuilder("mlp3")
    x = g.input("x", "float32", [batch, d_in])
    c = {k: g.constant(k, v) for k, v in w.items()}
    h1 = g.op("Relu", [g.op("Gemm", [x, c["w1"], c["b1"]])])
    h2 = g.op("Tanh", [g.op("Add", [g.op("MatMul", [h1, c["w2"]]), c["b2"]])])
    y = g.op("Gemm", [h2, c["w3t"], c["b3"]], transB=1)
    g.output("probs", g.op("Softmax", [y], axis=-1))
    g.output("hidden", h1)
    if gears:
        g.set_dynamic_batch(gears)

    def reference(xv):
        x64 = xv.astype(np.float64)
        a1 = np.maximum(x64 @ w["w1"] + w["b1"], 0)
        a2 = np.tanh(a1 @ w["w2"] + w["b2"])
        return [_softmax(a2 @ w["w3t"].T + w["b3"]), a1]
    return g.serialize(), reference


def _unsharded(rt, data, xv, gear=None):
    """The model on card 0 through the plain pyACL-style API."""
    from rt import mdl
    rt.set_device(0)
    model_id = mdl.load_from_mem(data)
    desc = mdl.get_desc(model_id)
    x = rt.Tensor.from_numpy(xv)
    ds_in, ds_out = mdl.create_dataset(), mdl.create_dataset()
    mdl.add_dataset_buffer(ds_in, mdl.create_data_buffer(x.ptr, x.nbytes))
    if gear is None:
        mdl.set_input_dynamic_dims(model_id, ds_in, 0, list(xv.shape))
    else:
        mdl.set_dynamic_batch_size(model_id, ds_in, 0, gear)
    outs = []
    for i, shape in enumerate([(len(xv), 12), (len(xv), 48)]):
        t = rt.empty(shape, np.float32)
        outs.append(t)
        mdl.add_dataset_buffer(ds_out, mdl.create_data_buffer(t.ptr, t.nbytes))
    assert mdl.get_num_outputs(desc) == 2
    mdl.execute(model_id, ds_in, ds_out)
    result = [t.numpy() for t in outs]
    mdl.unload(model_id)
    return result


# ---------------------------------------------------------------- planning (pure)

def test_plan_splits_columns_then_rows_with_one_all_reduce():
    data, _ = mlp(np.random.default_rng(0))
    plans = [plan_tensor(data, 4, r, min_shard_bytes=0) for r in range(4)]
    assert plans[0].sharded == ["Gemm_0 (column)", "MatMul_2 (row)", "Gemm_5 (column)"]
    colls = [s for s in plans[0].steps if isinstance(s, Collective)]
    # MatMul row-parallel → all_reduce before the bias Add; Gemm_5's columns → all_gather before
    # Softmax; the exported hidden activation → all_gather
    assert sorted(c.kind for c in colls) == ["all_gather", "all_gather", "all_reduce"]
    # w1, b1, w2, w3t, b3 are split 4 ways; b2 (added after the all-reduce) is replicated
    split = 4 * (16 * 48 + 48 + 48 * 48 + 12 * 48 + 12)
    assert all(p.weight_bytes == split // 4 + 4 * 48 for p in plans)


def test_small_weights_stay_replicated():
    data, _ = mlp(np.random.default_rng(0))
    plan = plan_tensor(data, 4, 0)                   # default threshold 1 MiB: nothing this small splits
    assert plan.sharded == [] and not [s for s in plan.steps if isinstance(s, Collective)]


def test_indivisible_dims_stay_replicated():
    data, _ = mlp(np.random.default_rng(0), hidden=50)
    plan = plan_tensor(data, 4, 0, min_shard_bytes=0)
    assert "Gemm_0 (column)" not in plan.sharded


# ---------------------------------------------------------------- on cards

@pytest.mark.parametrize("world", [2, 3, 4])
def test_tensor_sharded_equals_unsharded(rt_local, world):
    import hccl
    rng = np.random.default_rng(world)
    data, reference = mlp(rng)
    xv = rng.standard_normal((5, 16)).astype(np.float32)
    comms = hccl.comm_init_all(list(range(world)))
    with load_sharded(data, comms, "tensor", min_shard_bytes=0) as model:
        got = model.execute([xv])
        again = model.execute({"x": xv[:3]})         # another batch size with the same loaded model
    single = _unsharded(rt_local, data, xv)
    for out, one, ref in zip(got, single, reference(xv)):
        np.testing.assert_allclose(out, one, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    for out, ref in zip(again, reference(xv[:3])):
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_tensor_sharded_3d_activations(rt_local):
    """A (batch, seq, features) activation: the all-gather fix-up must concatenate the last axis."""
    import hccl
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((8, 24)) * 0.5).astype(np.float32)
    g = GraphBuilder("seq")
    x = g.input("x", "float32", [2, 3, 8])
    g.output("y", g.op("Gelu", [g.op("MatMul", [x, g.constant("w", w)])]))
    xv = rng.standard_normal((2, 3, 8)).astype(np.float32)
    comms = hccl.comm_init_all([0, 1, 2])
    with load_sharded(g.serialize(), comms, "tensor", min_shard_bytes=0) as model:
        assert model.plans[0].sharded == ["MatMul_0 (column)"]
        (y,) = model.execute([xv])
    z = xv.astype(np.float64) @ w
    from math import erf
    ref = 0.5 * z * (1 + np.vectorize(erf)(z / np.sqrt(2)))
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("world,batch,gears", [(4, 10, (1, 2, 4)), (3, 7, None), (2, 8, None)])
def test_batch_sharded_equals_unsharded(rt_local, world, batch, gears):
    import hccl
    rng = np.random.default_rng(batch)
    data, reference = mlp(rng, gears=gears)
    xv = rng.standard_normal((batch, 16)).astype(np.float32)
    comms = hccl.comm_init_all(list(range(world)))
    with load_sharded(data, comms, "batch") as model:
        got = model.execute([xv])
    for out, ref in zip(got, reference(xv)):
        assert out.shape == ref.shape
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    if gears is None:
        # The whole batch on one card is a different GEMM (7 rows instead of 3 + 3 + 1): BLAS may block
        # and sum it differently, so only a tolerance holds (measured: 2.9e-6 apart on some CPUs).
        for out, one in zip(got, _unsharded(rt_local, data, xv)):
            np.testing.assert_allclose(out, one, rtol=1e-5, atol=1e-6)
        # What is guaranteed: each rank runs the model on its own slice of the (zero-padded) batch, so the
        # same model on one card over exactly that slice runs the same kernels on the same rows.
        local = -(-batch // world)
        padded = np.zeros((local * world, 16), np.float32)
        padded[:batch] = xv
        for r in range(world):
            rows = slice(r * local, min((r + 1) * local, batch))
            if rows.start >= batch:
                continue
            for out, one in zip(got, _unsharded(rt_local, data, padded[r * local:(r + 1) * local])):
                n = rows.stop - rows.start
                assert out[rows].tobytes() == one[:n].tobytes(), f"rank {r}'s rows differ from its slice alone"


def test_batch_mode_rejects_a_batch_beyond_the_gears(rt_local):
    import hccl
    import rt
    data, _ = mlp(np.random.default_rng(1), gears=(1, 2))
    comms = hccl.comm_init_all([0, 1])
    with load_sharded(data, comms, "batch") as model:
        with pytest.raises(rt.AclError, match="largest gear 2") as e:
            model.execute([np.zeros((5, 16), np.float32)])
        assert e.value.code == rt.ACL_ERROR_MODEL_INPUT_NOT_MATCH
        with pytest.raises(rt.AclError, match="float64"):
            model.execute([np.zeros((2, 16))])


def test_batch_mode_slices_a_global_batch_over_a_static_batch_model(rt_local):
    """A static batch-2 model over 3 ranks takes up to 6 rows (each rank 2, the last one zero-padded),
    refuses 7 naming the static batch, and still checks the other dims."""
    import hccl
    import rt
    rng = np.random.default_rng(5)
    data, reference = mlp(rng, batch=2)
    comms = hccl.comm_init_all([0, 1, 2])
    with load_sharded(data, comms, "batch") as model:
        for batch in (5, 6, 1):
            xv = rng.standard_normal((batch, 16)).astype(np.float32)
            got = model.execute([xv])
            for out, ref in zip(got, reference(xv)):
                assert out.shape == ref.shape
                np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
        with pytest.raises(rt.AclError, match="static batch 2") as e:
            model.execute([np.zeros((7, 16), np.float32)])
        assert e.value.code == rt.ACL_ERROR_MODEL_INPUT_NOT_MATCH
        with pytest.raises(rt.AclError, match=r"float32\[4, 15\], expected float32\[2, 16\]"):
            model.execute([np.zeros((4, 15), np.float32)])


def test_bad_arguments(rt_local):
    import hccl
    import rt
    data, _ = mlp(np.random.default_rng(1))
    comms = hccl.comm_init_all([0, 1])
    with pytest.raises(rt.AclError, match="mode 'pipeline'"):
        load_sharded(data, comms, "pipeline")
    with pytest.raises(rt.AclError, match="Communicator"):
        load_sharded(data, "world")
    with pytest.raises(rt.AclError, match="distinct ranks"):
        load_sharded(data, [comms[0], comms[0]])


def big_model(rng, d=1024, hidden=9216):
    """Two 36 MiB weight matrices (72 MiB + biases): more than a 64 MiB card holds."""
    w1 = rng.standard_normal((d, hidden), dtype=np.float32) * np.float32(1 / np.sqrt(d))
    w2 = rng.standard_normal((hidden, d), dtype=np.float32) * np.float32(1 / np.sqrt(hidden))
    b1 = rng.standard_normal(hidden, dtype=np.float32) * np.float32(0.1)
    g = GraphBuilder("big_mlp")
    x = g.input("x", "float32", [-1, d])
    h = g.op("Relu", [g.op("Gemm", [x, g.constant("w1", w1), g.constant("b1", b1)])])
    g.output("y", g.op("MatMul", [h, g.constant("w2", w2)]))

    def reference(xv):
        return np.maximum(xv.astype(np.float64) @ w1 + b1, 0) @ w2
    return g.serialize(), reference


def test_model_larger_than_one_card_fails_on_one_and_runs_on_four(rt_factory):
    import hccl
    rt = rt_factory("small")                              # configs/small.toml: 64 MiB cards
    from rt import mdl
    assert rt.get_device_info(0).total_memory == 64 << 20
    rng = np.random.default_rng(0)
    data, reference = big_model(rng)
    rt.set_device(0)
    with pytest.raises(rt.AclError) as e:
        mdl.load_from_mem(data)
    assert e.value.code == rt.ACL_ERROR_RT_MEMORY_ALLOCATION == 207001
    comms = hccl.comm_init_all([0, 1, 2, 3])
    xv = rng.standard_normal((4, 1024), dtype=np.float32)
    with load_sharded(data, comms, "tensor") as model:
        assert all(b < 20 << 20 for b in model.weight_bytes.values())     # ~18 MiB per card
        assert model.plans[0].sharded == ["Gemm_0 (column)", "MatMul_2 (row)"]
        (y,) = model.execute([xv])
    np.testing.assert_allclose(y, reference(xv), rtol=1e-3, atol=1e-3)
