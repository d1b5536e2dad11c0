"""Data-parallel training equivalence: N cards with global batch B == 1 card with batch B.

One process drives every rank (local backend + ``hccl.comm_init_all``): each rank's work is only
enqueued, so the ranks' collectives meet on the cards. The 1-card run itself is checked against an
independent numpy implementation of the same MLP, loss, backward pass and optimizers.
"""

from __future__ import annotations

import importlib.util
import os
import re

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_train():
    spec = importlib.util.spec_from_file_location("npusim_example_train", os.path.join(ROOT, "examples", "train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train = _load_train()
HIDDEN, BATCH, STEPS, SEED = 32, 64, 6, 3


def run_cards(rt, world: int, *, optimizer="sgd", lr=0.05, steps=STEPS, **replica_kw):
    """Train ``steps`` steps on ``world`` cards; returns (per-step losses, params of every rank)."""
    import hccl
    (x, y), _ = train.make_dataset(SEED, n_train=BATCH * steps, n_test=8)
    params = train.init_params(SEED, HIDDEN)
    local = BATCH // world
    if world == 1:
        rt.set_device(0)
        replicas = [train.Replica(params, local_batch=local, optimizer=optimizer, lr=lr, **replica_kw)]
    else:
        comms = hccl.comm_init_all(list(range(world)))
        replicas = [train.Replica(params, local_batch=local, comm=c, optimizer=optimizer, lr=lr, **replica_kw)
                    for c in comms]
    for rep in replicas:
        rep.begin_epoch(steps)
    order = train.epoch_order(SEED, 0, len(x))
    for s in range(steps):
        idx = order[s * BATCH:(s + 1) * BATCH]
        for r, rep in enumerate(replicas):          # enqueue only: the ranks meet on the cards
            part = idx[r * local:(r + 1) * local]
            rep.train_step(x[part], y[part], s)
    for rep in replicas:
        rep.end_epoch()
    losses = replicas[0].epoch_losses()
    states = [rep.host_state() for rep in replicas]
    return losses, [[st[f"param{i}"] for i in range(6)] for st in states]


def numpy_reference(optimizer="sgd", lr=0.05, steps=STEPS, momentum=0.9):
    """The same training in float64 numpy, written from the formulas (the oracle)."""
    (x, y), _ = train.make_dataset(SEED, n_train=BATCH * steps, n_test=8)
    p = [a.astype(np.float64) for a in train.init_params(SEED, HIDDEN)]
    state = [[np.zeros_like(a), np.zeros_like(a)] for a in p]
    order = train.epoch_order(SEED, 0, len(x))
    losses = []
    for s in range(steps):
        idx = order[s * BATCH:(s + 1) * BATCH]
        xb, yb = x[idx].astype(np.float64), y[idx]
        h1 = xb @ p[0] + p[1]
        a1 = np.maximum(h1, 0)
        h2 = a1 @ p[2] + p[3]
        a2 = np.maximum(h2, 0)
        z = a2 @ p[4] + p[5]
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        losses.append(-logp[np.arange(len(yb)), yb].mean())
        d3 = np.exp(logp)
        d3[np.arange(len(yb)), yb] -= 1
        d3 /= len(yb)
        d2 = (d3 @ p[4].T) * (h2 > 0)
        d1 = (d2 @ p[2].T) * (h1 > 0)
        grads = [xb.T @ d1, d1.sum(0), a1.T @ d2, d2.sum(0), a2.T @ d3, d3.sum(0)]
        for i, g in enumerate(grads):
            if optimizer == "sgd":
                state[i][0] = momentum * state[i][0] + g
                p[i] = p[i] - lr * state[i][0]
            else:
                t = s + 1
                state[i][0] = 0.9 * state[i][0] + 0.1 * g
                state[i][1] = 0.999 * state[i][1] + 0.001 * g * g
                p[i] = p[i] - lr / (1 - 0.9 ** t) * state[i][0] / (np.sqrt(state[i][1] / (1 - 0.999 ** t)) + 1e-8)
    return np.array(losses), p


def _close(a, b, rtol, atol):
    for i, (u, v) in enumerate(zip(a, b)):
        np.testing.assert_allclose(u, v, rtol=rtol, atol=atol, err_msg=f"parameter {i}")


@pytest.mark.parametrize("optimizer,lr", [("sgd", 0.05), ("adam", 0.003)])
def test_one_card_matches_numpy_oracle(rt_local, optimizer, lr):
    losses, ranks = run_cards(rt_local, 1, optimizer=optimizer, lr=lr)
    ref_losses, ref_params = numpy_reference(optimizer, lr)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    _close(ranks[0], ref_params, rtol=2e-4, atol=2e-6)
    assert losses[-1] < losses[0]          # it learns


@pytest.mark.parametrize("world", [2, 4, 8])
def test_data_parallel_equals_one_card(rt_local, world):
    ref_losses, (ref,) = run_cards(rt_local, 1)
    losses, ranks = run_cards(rt_local, world)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    _close(ranks[0], ref, rtol=1e-4, atol=1e-6)
    for r in range(1, world):              # every rank applied the same averaged gradient
        for i, (a, b) in enumerate(zip(ranks[r], ranks[0])):
            assert np.array_equal(a, b), f"rank {r} parameter {i} differs from rank 0"


def test_data_parallel_adam_equals_one_card(rt_local):
    ref_losses, (ref,) = run_cards(rt_local, 1, optimizer="adam", lr=0.003)
    losses, ranks = run_cards(rt_local, 4, optimizer="adam", lr=0.003)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    _close(ranks[0], ref, rtol=1e-3, atol=1e-5)   # Adam divides by sqrt(v): tiny grads amplify rounding


@pytest.mark.parametrize("kw", [{"bucket_bytes": 2048}, {"bucketing": False}], ids=["small-buckets", "per-tensor"])
def test_bucket_layouts_train_the_same(rt_local, kw):
    ref_losses, (ref,) = run_cards(rt_local, 1)
    losses, ranks = run_cards(rt_local, 4, **kw)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    _close(ranks[0], ref, rtol=1e-4, atol=1e-6)


def test_deterministic_mode_is_bit_identical_run_to_run(rt_factory, monkeypatch):
    monkeypatch.setenv("HCCL_DETERMINISTIC", "true")
    rt = rt_factory()
    first_losses, first = run_cards(rt, 4)
    rt.finalize()
    rt = rt_factory()
    again_losses, again = run_cards(rt, 4)
    assert np.array_equal(first_losses, again_losses)
    for i, (a, b) in enumerate(zip(first[0], again[0])):
        assert np.array_equal(a, b), f"parameter {i} differs between two deterministic runs"


def test_checkpoint_is_atomic_and_round_trips(tmp_path):
    path = str(tmp_path / "ck.npz")
    state = {"param0": np.arange(6, dtype=np.float32).reshape(2, 3), "adam_step": np.array(4)}
    meta = {"seed": 1, "hidden": 8, "optimizer": "sgd"}
    train.save_checkpoint(path, state, 3, meta)
    assert sorted(os.listdir(tmp_path)) == ["ck.npz"]        # the temp file was renamed away
    saved, epoch = train.load_checkpoint(path, meta)
    assert epoch == 3 and np.array_equal(saved["param0"], state["param0"])
    with pytest.raises(SystemExit, match="hidden=8"):
        train.load_checkpoint(path, dict(meta, hidden=16))


def _train_in_process(rt, world, *, epochs, train_size, batch, seed=0, hidden=128, lr=0.01):
    """examples/train.py's epoch loop, every rank driven from this process (local backend)."""
    import hccl
    (x, y), _ = train.make_dataset(seed, n_train=train_size, n_test=8)
    comms = hccl.comm_init_all(list(range(world)))
    local = batch // world
    replicas = [train.Replica(train.init_params(seed, hidden), local_batch=local, comm=c, lr=lr) for c in comms]
    steps = train_size // batch
    for epoch in range(epochs):
        order = train.epoch_order(seed, epoch, train_size)
        for rep in replicas:
            rep.begin_epoch(steps)
        for s in range(steps):
            for r, rep in enumerate(replicas):
                idx = order[s * batch + r * local: s * batch + (r + 1) * local]
                rep.train_step(x[idx], y[idx], s)
    return replicas[0].host_state()


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(240)
def test_rank_failure_restarts_from_checkpoint_and_finishes(tmp_path, rt_local):
    """launch --max-restarts 1: rank 1 dies in epoch 3; the group restarts, resumes from the last
    checkpoint and ends with the parameters of an uninterrupted run."""
    import shutil
    import subprocess
    import sys
    import tempfile
    ckpt = tmp_path / "ck.npz"
    # A private, short Ray temp dir: `ray.init()` would otherwise join any Ray cluster another
    # process started on this machine (it reads /tmp/ray/ray_current_cluster).
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")
    env = dict(os.environ, RAY_TMPDIR=ray_tmp, PYTHONPATH=ROOT)
    env.pop("NPUSIM_BACKEND", None)
    args = ["--epochs", "3", "--train-size", "2048", "--test-size", "256", "--batch-size", "256",
            "--checkpoint", str(ckpt), "--resume", "--fail-at-step", "19"]          # 8 steps/epoch
    try:
        proc = subprocess.run([sys.executable, "-m", "launcher", "--max-restarts", "1", "--nproc", "2",
                               "--timeout", "200", os.path.join(ROOT, "examples", "train.py"), *args],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=230)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "failing on purpose at step 19" in out
    # rank 1 may die while rank 0 is still writing the epoch-2 checkpoint (rank 1 only enqueues
    # steps 16-19, it does not wait for rank 0): then the group resumes from epoch 1's
    resumed = re.search(r"resumed from \S+ at epoch (\d)", out)
    assert resumed and resumed.group(1) in ("1", "2"), out[-3000:]
    assert "epoch 3/3" in out and f"done: {3 - int(resumed.group(1))} epochs on 2 card(s)" in out
    saved, epoch = train.load_checkpoint(str(ckpt), {"seed": 0, "hidden": 128, "optimizer": "sgd"})
    assert epoch == 3
    ref = _train_in_process(rt_local, 2, epochs=3, train_size=2048, batch=256)
    for i in range(6):
        np.testing.assert_allclose(saved[f"param{i}"], ref[f"param{i}"], rtol=1e-6, atol=1e-7,
                                   err_msg=f"parameter {i} after restart differs from an uninterrupted run")
