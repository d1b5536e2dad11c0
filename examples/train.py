"""Data-parallel training of an MLP classifier on simulated NPU cards — the README's main job.

    launch --nproc 8 examples/train.py                  # 8 ranks, one card each
    python examples/train.py                            # one card, no launcher
    launch --nproc 2 --max-restarts 1 examples/train.py --checkpoint /tmp/ck.npz --resume

Every rank holds the same MLP (64 → hidden → hidden → 10, ReLU) on its card. Each step the global
batch (``--batch-size``) is split evenly over the ranks; forward, softmax cross-entropy and the
backward pass run on the card with the built-in kernels (Gemm, Relu, ReluGrad, ReduceSum,
SoftmaxCrossEntropyLoss(+Grad)); the backward kernels write gradients into the buckets of
``hccl.DataParallel``, which all-reduces and averages each bucket on a communication stream while
the rest of the backward pass runs; then SGD-momentum or Adam updates the parameters on the card.
Rank 0 prints loss and test accuracy per epoch and a final line with wall time and samples/s.

Data: scikit-learn is not a dependency, so the data set is synthetic and deterministic from
``--seed``: 10 Gaussian blobs in 64 dimensions whose centres are close enough that the classes
overlap (the best possible test accuracy, knowing the true centres, is about 87%).

Checkpoints: with ``--checkpoint PATH`` rank 0 writes parameters + optimizer state after every
epoch (``.npz``; written to a temporary file, then ``os.replace``d, so a crash never leaves a
torn file); ``--resume`` continues from it when it exists. Under ``launch --max-restarts 1`` a run
whose rank dies mid-epoch restarts and continues from the last finished epoch.
``HCCL_DETERMINISTIC=true`` makes the run bit-identical from run to run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python examples/train.py

import hccl  # noqa: E402
import rt  # noqa: E402
from hccl.ddp import DataParallel, all_reduce_gradients  # noqa: E402

FEATURES, CLASSES = 64, 10


# ---------------------------------------------------------------------------------------------- data

def make_dataset(seed: int, n_train: int = 16384, n_test: int = 2048, spread: float = 0.35):
    """10 overlapping Gaussian blobs in 64-D (float32 features, int64 labels), from ``seed`` alone;
    the training set does not depend on ``n_test`` (separate random streams)."""
    centres = np.random.default_rng([seed, 0xDA7A]).standard_normal((CLASSES, FEATURES)) * spread

    def draw(n, stream):
        rng = np.random.default_rng([seed, 0xDA7A, stream])
        labels = rng.integers(0, CLASSES, n)
        return (centres[labels] + rng.standard_normal((n, FEATURES))).astype(np.float32), labels.astype(np.int64)
    return draw(n_train, 1), draw(n_test, 2)


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The sample order of one epoch: every rank computes the same permutation."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def init_params(seed: int, hidden: int) -> list[np.ndarray]:
    """He-initialised [W1, b1, W2, b2, W3, b3]; W is (in, out) so a layer is Gemm(x, W, b)."""
    rng = np.random.default_rng([seed, 0x1417])
    sizes = [FEATURES, hidden, hidden, CLASSES]
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        params.append((rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32))
        params.append(np.zeros(fan_out, np.float32))
    return params


# ---------------------------------------------------------------------------------------------- model

class Replica:
    """One rank's model on its card: parameters, optimizer state, gradient sync, fixed work buffers.

    Every method only *enqueues* work on the card (except those documented as blocking), so one
    process can drive several replicas — the equivalence tests do that with ``comm_init_all``.
    """

    def __init__(self, params, *, local_batch: int, comm=None, optimizer: str = "sgd", lr: float = 0.05,
                 momentum: float = 0.9, bucket_bytes: int | None = None, bucketing: bool = True,
                 timing: bool = False):
        self.comm = comm
        self.ctx = comm.ctx if comm is not None else rt.get_context()
        self.world = 1 if comm is None else comm.size
        self.optimizer, self.lr, self.momentum = optimizer, lr, momentum
        self.adam_step = 0
        self.local_batch = local_batch
        rt.set_context(self.ctx)
        self.params = [rt.Tensor.from_numpy(p) for p in params]
        self.state = [[rt.Tensor.from_numpy(np.zeros_like(p)) for _ in range(1 if optimizer == "sgd" else 2)]
                      for p in params]
        self.dp = None
        self.timing = timing
        self._sync_events = (rt.create_event(), rt.create_event()) if timing else None
        if comm is not None and bucketing:
            kw = {} if bucket_bytes is None else {"bucket_bytes": bucket_bytes}
            self.dp = DataParallel(comm, self.params, timing=timing, **kw)
            self.grads = self.dp.grads
        else:
            self.grads = [rt.empty(p.shape, p.dtype) for p in self.params]
        if comm is not None:
            hccl.ddp.broadcast_parameters(self.params, comm)   # rank 0's values everywhere, as DDP does
        # dloss = 1 for the loss gradient; shaped () through a view because Tensor.from_numpy goes
        # through np.ascontiguousarray, which turns a 0-d array into shape (1,)
        self._one = rt.Tensor.from_numpy(np.ones(1, np.float32))
        self.one = self._one.view(())
        self.x = rt.empty((local_batch, FEATURES), np.float32)
        self.y = rt.empty((local_batch,), np.int64)
        self.act = self._activations(local_batch)
        self.losses = None

    def _activations(self, batch: int) -> dict:
        hidden = self.params[0].shape[1]
        e = rt.empty
        return {"h1": e((batch, hidden), np.float32), "a1": e((batch, hidden), np.float32),
                "h2": e((batch, hidden), np.float32), "a2": e((batch, hidden), np.float32),
                "logits": e((batch, CLASSES), np.float32), "logp": e((batch, CLASSES), np.float32),
                "d3": e((batch, CLASSES), np.float32), "da2": e((batch, hidden), np.float32),
                "d2": e((batch, hidden), np.float32), "da1": e((batch, hidden), np.float32),
                "d1": e((batch, hidden), np.float32)}

    def _forward(self, x, act):
        ops, (w1, b1, w2, b2, w3, b3) = rt.ops, self.params
        ops.gemm(x, w1, b1, out=[act["h1"]])
        ops.relu(act["h1"], out=[act["a1"]])
        ops.gemm(act["a1"], w2, b2, out=[act["h2"]])
        ops.relu(act["h2"], out=[act["a2"]])
        ops.gemm(act["a2"], w3, b3, out=[act["logits"]])

    def begin_epoch(self, steps: int) -> None:
        rt.set_context(self.ctx)
        if self.losses is None or self.losses.shape != (steps,):
            self.losses = rt.empty((steps,), np.float32)

    def train_step(self, x: np.ndarray, y: np.ndarray, step: int) -> None:
        """Enqueue one step on this rank's slice of the global batch; the loss lands in losses[step]."""
        rt.set_context(self.ctx)
        ops, act, g = rt.ops, self.act, self.grads
        self.x.copy_from(x, stream=0)
        self.y.copy_from(y, stream=0)
        self._forward(self.x, act)
        ops.softmax_cross_entropy_loss(act["logits"], self.y, reduction="mean",
                                       out=[self.losses.view((), offset=4 * step), act["logp"]])
        # backward, last layer first; each gradient is marked ready as soon as it is enqueued
        ops.softmax_cross_entropy_loss_grad(self.one, act["logp"], self.y, reduction="mean", out=[act["d3"]])
        layers = [(act["a2"], act["d3"], 4), (act["a1"], act["d2"], 2), (self.x, act["d1"], 0)]
        below = [(act["da2"], act["h2"], act["d2"]), (act["da1"], act["h1"], act["d1"]), None]
        for (inp, dout, w), nxt in zip(layers, below):
            ops.gemm(inp, dout, transA=1, out=[g[w]])
            self._ready(w)
            ops.reduce_sum(dout, axes=[0], keepdims=0, out=[g[w + 1]])
            self._ready(w + 1)
            if nxt is not None:
                da, h, d = nxt
                ops.gemm(dout, self.params[w], transB=1, out=[da])
                ops.relu_grad(da, h, out=[d])
        if self.dp is not None:
            self.dp.finish()
        elif self.comm is not None:
            if self.timing:
                rt.record_event(self._sync_events[0], None)
            all_reduce_gradients(self.grads, self.comm)
            if self.timing:
                rt.record_event(self._sync_events[1], None)
        self._update()

    def comm_ms(self) -> float:
        """Blocking; needs timing=True: card-measured ms of the last step's gradient all-reduce(s)
        (including any wait for slower peers)."""
        rt.set_context(self.ctx)
        rt.synchronize_device()
        if self.dp is not None:
            return self.dp.comm_time_ms()
        if self.comm is None:
            return 0.0
        return rt.event_elapsed_time(*self._sync_events)

    def _ready(self, i: int) -> None:
        if self.dp is not None:
            self.dp.mark_ready(i)

    def _update(self) -> None:
        self.adam_step += 1
        for p, grad, st in zip(self.params, self.grads, self.state):
            if self.optimizer == "sgd":
                rt.ops.sgd_momentum(p, grad, st[0], lr=self.lr, momentum=self.momentum)
            else:
                rt.ops.adam(p, grad, st[0], st[1], lr=self.lr, step=self.adam_step)

    def end_epoch(self) -> None:
        """Enqueue the sum of the per-step losses over ranks (read it with :meth:`epoch_losses`)."""
        if self.comm is not None:
            rt.set_context(self.ctx)
            self.comm.all_reduce(self.losses)

    def epoch_losses(self) -> np.ndarray:
        """Blocking: the global-batch loss of every step of the epoch."""
        return self.losses.numpy() / self.world

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """Blocking: (summed loss, correct predictions) over this rank's test slice."""
        rt.set_context(self.ctx)
        act = self._activations(len(x))
        xt, yt = rt.Tensor.from_numpy(x), rt.Tensor.from_numpy(y)
        self._forward(xt, act)
        loss, _ = rt.ops.softmax_cross_entropy_loss(act["logits"], yt, reduction="sum")
        logits = act["logits"].numpy()
        total = float(loss.numpy())
        for t in (xt, yt, loss, *act.values()):
            t.free()
        return total, int((logits.argmax(axis=1) == y).sum())

    def host_state(self) -> dict[str, np.ndarray]:
        """Blocking: parameters and optimizer state as numpy arrays (checkpoint contents)."""
        rt.set_context(self.ctx)
        out = {f"param{i}": p.numpy() for i, p in enumerate(self.params)}
        for i, st in enumerate(self.state):
            for k, t in enumerate(st):
                out[f"state{i}_{k}"] = t.numpy()
        out["adam_step"] = np.array(self.adam_step)
        return out

    def load_state(self, saved) -> None:
        """Enqueue the checkpoint's values on the default stream: ordered after the initial broadcast
        of the parameters (a synchronous copy could land before it and be overwritten)."""
        rt.set_context(self.ctx)
        for i, p in enumerate(self.params):
            p.copy_from(saved[f"param{i}"], stream=0)
        for i, st in enumerate(self.state):
            for k, t in enumerate(st):
                t.copy_from(saved[f"state{i}_{k}"], stream=0)
        self.adam_step = int(saved["adam_step"])


# ---------------------------------------------------------------------------------------------- checkpoints

def save_checkpoint(path: str, state: dict, epoch: int, meta: dict) -> None:
    """Write atomically: a temp file next to ``path``, then os.replace (a crash leaves the old file)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, epoch=np.array(epoch), **state, **{f"meta_{k}": np.array(v) for k, v in meta.items()})
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: str, meta: dict):
    """(state dict, next epoch) from ``path``; refuses a checkpoint of a different model or run."""
    with np.load(path) as z:
        saved = {k: z[k] for k in z.files}
    for k, v in meta.items():
        if f"meta_{k}" not in saved or saved[f"meta_{k}"].item() != v:
            got = saved.get(f"meta_{k}")
            raise SystemExit(f"--resume: checkpoint {path} was written with {k}={None if got is None else got.item()!r}, "
                             f"this run has {k}={v!r}")
    return saved, int(saved["epoch"])


# ---------------------------------------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=256, help="global batch, split evenly over the ranks")
    p.add_argument("--lr", type=float, default=None, help="default 0.01 (sgd) / 0.001 (adam)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--train-size", type=int, default=16384)
    p.add_argument("--test-size", type=int, default=2048)
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd", help="sgd = SGD with momentum 0.9")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket size in MiB")
    p.add_argument("--no-bucketing", action="store_true", help="one all_reduce per gradient tensor instead")
    p.add_argument("--checkpoint", default=None, help="rank 0 saves here after every epoch (.npz)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint if it exists")
    p.add_argument("--fail-at-step", type=int, default=None, help=argparse.SUPPRESS)   # restart test
    p.add_argument("--profile-steps", type=int, default=0,
                   help="after training, run N synchronised steps and print step / all-reduce / compute ms")
    p.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.lr is None:
        args.lr = 0.01 if args.optimizer == "sgd" else 0.001
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint PATH")
    return args


def setup():
    """(comm or None, rank, world): the launcher's world communicator, or one card on our own."""
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        comm = hccl.init()
        return comm, comm.rank, comm.size
    rt.init()
    rt.set_device(0)
    return None, 0, 1


def main(argv=None) -> None:
    args = parse_args(argv)
    t_setup = time.perf_counter()
    comm, rank, world = setup()
    say = print if rank == 0 and not args.quiet else (lambda *a, **k: None)
    if args.batch_size % world:
        raise SystemExit(f"--batch-size {args.batch_size} must be divisible by the world size {world}")
    local = args.batch_size // world
    (x_train, y_train), (x_test, y_test) = make_dataset(args.seed, args.train_size, args.test_size)
    steps = len(x_train) // args.batch_size
    meta = {"seed": args.seed, "hidden": args.hidden, "optimizer": args.optimizer}
    replica = Replica(init_params(args.seed, args.hidden), local_batch=local, comm=comm, optimizer=args.optimizer,
                      lr=args.lr, bucket_bytes=int(args.bucket_mb * (1 << 20)), bucketing=not args.no_bucketing,
                      timing=args.profile_steps > 0)
    start_epoch = 0
    if args.resume and os.path.exists(args.checkpoint):
        saved, start_epoch = load_checkpoint(args.checkpoint, meta)
        replica.load_state(saved)
        say(f"resumed from {args.checkpoint} at epoch {start_epoch}")
    say(f"training MLP {FEATURES}-{args.hidden}-{args.hidden}-{CLASSES} on {world} card(s): {len(x_train)} samples, "
        f"global batch {args.batch_size} ({local}/rank), {steps} steps/epoch, {args.optimizer} lr={args.lr}"
        + (f", DDP {replica.dp}" if replica.dp is not None and not args.quiet else ""))
    test_lo, test_hi = len(x_test) * rank // world, len(x_test) * (rank + 1) // world
    setup_s = time.perf_counter() - t_setup
    t0 = time.perf_counter()
    for epoch in range(start_epoch, args.epochs):
        order = epoch_order(args.seed, epoch, len(x_train))
        replica.begin_epoch(steps)
        for s in range(steps):
            if args.fail_at_step is not None and rank == min(1, world - 1) and \
                    epoch * steps + s == args.fail_at_step and os.environ.get("RESTART_COUNT", "0") == "0":
                print(f"rank {rank}: failing on purpose at step {args.fail_at_step} (--fail-at-step)", flush=True)
                os._exit(1)
            idx = order[s * args.batch_size + rank * local: s * args.batch_size + (rank + 1) * local]
            replica.train_step(x_train[idx], y_train[idx], s)
        replica.end_epoch()
        losses = replica.epoch_losses()
        loss_sum, correct = replica.evaluate(x_test[test_lo:test_hi], y_test[test_lo:test_hi])
        totals = np.array([loss_sum, correct], np.float64)
        if comm is not None:
            t = rt.Tensor.from_numpy(totals)
            comm.all_reduce(t)
            totals = t.numpy()
            t.free()
        say(f"epoch {epoch + 1}/{args.epochs}: train loss {losses.mean():.4f} (last step {losses[-1]:.4f})  "
            f"test loss {totals[0] / len(x_test):.4f}  test accuracy {totals[1] / len(x_test):.2%}")
        if args.checkpoint and rank == 0:
            save_checkpoint(args.checkpoint, replica.host_state(), epoch + 1, meta)
    rt.synchronize_device()
    wall = time.perf_counter() - t0
    samples = (args.epochs - start_epoch) * steps * args.batch_size
    say(f"done: {args.epochs - start_epoch} epochs on {world} card(s) in {wall:.2f} s "
        f"(setup {setup_s:.2f} s), {samples / wall if wall else 0:.0f} samples/s")
    if args.profile_steps:
        profile(replica, args, x_train, y_train, rank, local, say)
    if comm is not None:
        hccl.comm_destroy(comm)


def profile(replica: Replica, args, x_train, y_train, rank: int, local: int, say) -> None:
    """Synchronised steps (no overlap between steps): wall ms per step, and how much of it the
    card spent in the gradient all-reduce."""
    order = epoch_order(args.seed, 10_000, len(x_train))
    replica.begin_epoch(args.profile_steps)
    step_ms, comm_ms = [], []
    for s in range(args.profile_steps):
        idx = order[s * args.batch_size + rank * local: s * args.batch_size + (rank + 1) * local]
        t0 = time.perf_counter()
        replica.train_step(x_train[idx], y_train[idx], s)
        comm_ms.append(replica.comm_ms())
        step_ms.append((time.perf_counter() - t0) * 1000)
    step, comm = float(np.median(step_ms)), float(np.median(comm_ms))
    say(f"profile: {args.profile_steps} steps, median step {step:.2f} ms, all_reduce {comm:.2f} ms, "
        f"compute+launch {step - comm:.2f} ms")


if __name__ == "__main__":
    main()
