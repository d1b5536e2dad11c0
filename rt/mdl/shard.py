"""Sharded loading: one offline model across the ranks of an HCCL communicator (DESIGN §3).

    comm = hccl.init()                                        # one rank per process (launch)
    model = load_sharded("big.om", comm, mode="tensor")
    (y,) = model.execute([x])                                 # same x on every rank; y on every rank

    comms = hccl.comm_init_all([0, 1, 2, 3])                  # or one process driving four cards
    model = load_sharded(data, comms, mode="batch")

Two modes:

- ``mode="batch"``: every card loads the whole model; ``execute`` gives each rank a contiguous
  slice of the batch (dim 0 of every input, padded to equal slices: the batch size of a dynamic-
  batch model's gear, or the declared batch of a static one), and the outputs are all-gathered
  so every rank returns the full batch.
- ``mode="tensor"`` (Megatron-LM): the graph is rewritten per rank. A ``MatMul``/``Gemm`` whose
  constant weight holds at least ``min_shard_bytes`` is split across the ranks:
  *column-parallel* (the weight's output columns, and a bias, are split) when its input is
  replicated — its output is then sharded along the last axis; *row-parallel* (the weight's input
  rows are split) when its input is already column-sharded — its output is then a partial sum,
  and the bias is kept by rank 0 only. Elementwise ops pass sharded values through (a constant
  operand is sliced to match); partial sums pass through Add/Sub of two partial sums and Mul/Div
  by a replicated value. Anything else needs the full value, so the planner inserts an
  ``all_reduce`` (partial sum → full) or an ``all_gather`` (sharded → full, followed by a
  Transpose + Reshape that turns the rank-major gather into the concatenation along the last
  axis) and starts a new *stage*. Each stage is an ordinary offline model loaded on the rank's
  card; ``execute`` enqueues stage, collective, stage, ... on one stream of each rank.

Each card holds only its shards, so a model larger than one card's HBM runs on several. Weights
too small or with dims not divisible by the world size stay replicated. ``plan_tensor`` is pure
(no cards) and shows what a model becomes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import args
from ..constants import AclErrorCode
from ..errors import AclError
from ..kernels import registry
from . import api
from . import format as fmt

INVALID = AclErrorCode.ACL_ERROR_INVALID_PARAM
DEFAULT_MIN_SHARD_BYTES = 1 << 20
UNARY = {"Relu", "Gelu", "Tanh", "Sigmoid", "Exp", "Log", "Neg", "Sqrt", "Cast", "Identity"}
BINARY = {"Add", "Sub", "Mul", "Div"}
REPLICATED, PARTIAL = "R", "P"       # layouts; a sharded value's layout is ("S", full last dim)


@dataclasses.dataclass(frozen=True)
class Collective:
    """A collective between stages: ``dst`` = all_reduce(src) or all_gather(src) (rank-major)."""

    kind: str
    src: str
    dst: str


@dataclasses.dataclass
class RankPlan:
    """What one rank runs: stage models and the collectives between them (``steps`` in order)."""

    rank: int
    steps: list                     # fmt.ModelDef (a stage) or Collective
    weight_bytes: int               # bytes of weights this rank holds
    sharded: list[str]              # the split weight-matrix nodes, "name (column|row)"
    inputs: list[str] = dataclasses.field(default_factory=list)    # model input names
    outputs: list[str] = dataclasses.field(default_factory=list)   # value holding each model output
    specs: dict = dataclasses.field(default_factory=dict)          # symbolic spec of every value


# ---------------------------------------------------------------------------------------------- planning

class _Rewriter:
    """Rewrites a model's nodes for one rank of ``world``, tracking each value's layout."""

    def __init__(self, model: fmt.ModelDef, world: int, rank: int, min_shard_bytes: int):
        self.model, self.n, self.rank, self.min_bytes = model, world, rank, min_shard_bytes
        self.weights = {w.name: w for w in model.weights}
        self.out_weights: dict[str, fmt.Weight] = {}
        self.layout: dict[str, object] = {v.name: REPLICATED for v in model.inputs}
        self.layout.update((w, REPLICATED) for w in self.weights)
        self.full: dict[str, str] = {}            # value -> name of its materialised (replicated) copy
        self.items: list = []
        self.sharded: list[str] = []
        self.specs = {v.name: v.spec for v in model.inputs}
        self.specs.update((w.name, w.spec) for w in model.weights)

    # -- weights -------------------------------------------------------------------------------
    def _use_weight(self, name: str, axis: int | None = None, as_name: str | None = None) -> str:
        """Emit weight ``name`` for this rank (its slice along ``axis`` if given); returns its name."""
        w = self.weights[name]
        out = as_name or name
        if out not in self.out_weights:
            if axis is None:
                self.out_weights[out] = w
            else:
                arr = w.array()
                k = arr.shape[axis] // self.n
                part = np.ascontiguousarray(np.take(arr, np.arange(self.rank * k, (self.rank + 1) * k), axis=axis))
                self.out_weights[out] = fmt.Weight(out, w.dtype, part.shape, part.tobytes())
        return out

    def _ref(self, name: str) -> str:
        """A node input as this rank sees it (weights are emitted whole on first use)."""
        if name in self.weights:
            return self._use_weight(name)
        return name

    # -- materialisation -----------------------------------------------------------------------
    def _materialise(self, name: str) -> str:
        lay = self.layout[name]
        if lay == REPLICATED:
            return self._ref(name)
        if name in self.full:
            return self.full[name]
        if lay == PARTIAL:
            dst = f"{name}::allreduce"
            self.items.append(Collective("all_reduce", name, dst))
        else:
            rank = len(self.specs[name].shape)
            raw, moved = f"{name}::allgather", f"{name}::ranklast"
            self.items.append(Collective("all_gather", name, raw))
            # (n, d1..dk-1, c/n) -> (d1..dk-1, n, c/n) -> (d1..dk-1, c)
            perm = list(range(1, rank)) + [0, rank]
            self._emit("Transpose", [raw], [moved], {"perm": perm}, f"{name}::gather_t")
            dst = f"{name}::gathered"
            self._emit("Reshape", [moved], [dst], {"shape": [0] * (rank - 1) + [-1]}, f"{name}::gather_r")
        self.layout[dst] = REPLICATED
        self.full[name] = dst
        return dst

    def _emit(self, op, inputs, outputs, attrs, name) -> None:
        node = fmt.Node(op, name, tuple(inputs), tuple(outputs), dict(attrs))
        got = registry.infer(op, [self._spec(v) for v in inputs], node.attrs)
        self.specs.update(zip(outputs, got))
        self.items.append(node)

    def _spec(self, value: str) -> registry.TensorSpec:
        if value in self.out_weights:
            return self.out_weights[value].spec
        if value in self.specs:
            return self.specs[value]
        item = next(i for i in reversed(self.items) if isinstance(i, Collective) and i.dst == value)
        src = self._spec(item.src)
        shape = src.shape if item.kind == "all_reduce" else (self.n,) + src.shape
        self.specs[value] = registry.TensorSpec(shape, src.dtype)
        return self.specs[value]

    # -- nodes ---------------------------------------------------------------------------------
    def node(self, node: fmt.Node) -> None:
        handled = self._linear(node) or self._elementwise(node)
        if not handled:
            self._emit(node.op, [self._materialise(v) for v in node.inputs], node.outputs, node.attrs, node.name)
            self.layout.update((o, REPLICATED) for o in node.outputs)

    def _linear(self, node: fmt.Node) -> bool:
        if node.op not in ("MatMul", "Gemm") or len(node.inputs) < 2 or node.inputs[1] not in self.weights:
            return False
        a, w_name = node.inputs[0], node.inputs[1]
        w = self.weights[w_name]
        trans_b = node.op == "Gemm" and int(node.attrs.get("transB", 0)) == 1
        if len(w.shape) != 2 or w.nbytes < self.min_bytes or (node.op == "Gemm" and int(node.attrs.get("transA", 0))):
            return False
        k_dim, n_dim = (w.shape[1], w.shape[0]) if trans_b else w.shape
        c = node.inputs[2] if len(node.inputs) == 3 else None
        if c is not None and c not in self.weights:
            return False
        lay = self.layout[a]
        out = node.outputs[0]
        if lay == REPLICATED and n_dim % self.n == 0:                          # column-parallel
            inputs = [self._ref(a), self._use_weight(w_name, 0 if trans_b else 1, f"{w_name}::col")]
            if c is not None:
                cw = self.weights[c]
                sliced = cw.shape and cw.shape[-1] == n_dim
                inputs.append(self._use_weight(c, len(cw.shape) - 1, f"{c}::col") if sliced else self._ref(c))
            self._emit(node.op, inputs, [out], node.attrs, node.name)
            self.layout[out] = ("S", n_dim)
            self.sharded.append(f"{node.name} (column)")
            return True
        if isinstance(lay, tuple) and lay[1] == k_dim and k_dim % self.n == 0:  # row-parallel
            inputs = [a, self._use_weight(w_name, 1 if trans_b else 0, f"{w_name}::row")]
            if c is not None and self.rank == 0:        # the bias is added once, by rank 0
                inputs.append(self._ref(c))
            attrs = dict(node.attrs)
            self._emit(node.op, inputs, [out], attrs, node.name)
            self.layout[out] = PARTIAL
            self.sharded.append(f"{node.name} (row)")
            return True
        return False

    def _elementwise(self, node: fmt.Node) -> bool:
        lays = [self.layout.get(v, REPLICATED) for v in node.inputs]
        out = node.outputs[0] if node.outputs else None
        if node.op in UNARY and len(node.inputs) == 1 and isinstance(lays[0], tuple):
            self._emit(node.op, node.inputs, node.outputs, node.attrs, node.name)
            self.layout[out] = lays[0]
            return True
        if node.op not in BINARY or len(node.inputs) != 2:
            return False
        sharded = [lay for lay in lays if isinstance(lay, tuple)]
        if sharded and all(isinstance(lay, tuple) or v in self.weights for v, lay in zip(node.inputs, lays)):
            full = sharded[0][1]
            if any(lay != sharded[0] for lay in sharded):
                return False
            inputs = []
            for v, lay in zip(node.inputs, lays):
                if isinstance(lay, tuple):
                    inputs.append(v)
                    continue
                w = self.weights[v]
                if w.shape and w.shape[-1] == full:
                    inputs.append(self._use_weight(v, len(w.shape) - 1, f"{v}::col"))
                elif not w.shape or w.shape[-1] == 1:
                    inputs.append(self._use_weight(v))
                else:
                    return False
            self._emit(node.op, inputs, node.outputs, node.attrs, node.name)
            self.layout[out] = sharded[0]
            return True
        linear_in_partial = (node.op in ("Add", "Sub") and lays == [PARTIAL, PARTIAL]) or \
            (node.op in ("Mul", "Div") and lays[0] == PARTIAL and lays[1] == REPLICATED) or \
            (node.op == "Mul" and lays == [REPLICATED, PARTIAL])
        if linear_in_partial:
            self._emit(node.op, [self._ref(v) for v in node.inputs], node.outputs, node.attrs, node.name)
            self.layout[out] = PARTIAL
            return True
        return False


def _stages(items: list, final: list[str], weights: dict, specs: dict, tag: str) -> list:
    """Cut the rewritten items into stage ModelDefs at every collective."""
    groups, current = [], []
    for item in items:
        if isinstance(item, Collective):
            groups.append(current)
            groups.append(item)
            current = []
        else:
            current.append(item)
    groups.append(current)
    steps = []
    for g, group in enumerate(groups):
        if isinstance(group, Collective):
            steps.append(group)
            continue
        if not group:
            continue
        later = set(final)
        for other in groups[g + 1:]:
            later.update([other.src] if isinstance(other, Collective) else [v for n in other for v in n.inputs])
        produced = [o for n in group for o in n.outputs]
        inputs, used_w = [], []
        for n in group:
            for v in n.inputs:
                if v in weights:
                    if v not in used_w:
                        used_w.append(v)
                elif v not in produced and v not in inputs:
                    inputs.append(v)
        outputs = [o for o in produced if o in later]
        if not outputs:
            continue
        stage = fmt.ModelDef(
            name=f"{tag}.stage{len([s for s in steps if isinstance(s, fmt.ModelDef)])}",
            inputs=tuple(fmt.ValueInfo(v, specs[v].dtype, specs[v].shape) for v in inputs),
            outputs=tuple(fmt.ValueInfo(v, specs[v].dtype, specs[v].shape) for v in outputs),
            nodes=tuple(group), weights=tuple(weights[w] for w in used_w))
        steps.append(fmt.check_graph(stage))
    return steps


def _as_model(model) -> fmt.ModelDef:
    if isinstance(model, fmt.ModelDef):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        return fmt.parse(bytes(model))
    return fmt.parse(fmt.read_model_file(model))


def plan_tensor(model, world: int, rank: int, *, min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES) -> RankPlan:
    """The tensor-parallel program of ``rank`` of ``world`` (pure: no cards involved)."""
    world = args.integer(world, "plan_tensor", "world", lo=1, hi=1 << 16)
    rank = args.integer(rank, "plan_tensor", "rank", hi=world - 1)
    min_shard_bytes = args.integer(min_shard_bytes, "plan_tensor", "min_shard_bytes")
    model = _as_model(model)
    rw = _Rewriter(model, world, rank, min_shard_bytes)
    for node in model.nodes:
        rw.node(node)
    outputs = []
    for v in model.outputs:
        if v.name in rw.weights or v.name in rw.layout and v.name in {i.name for i in model.inputs}:
            raise AclError(INVALID, f"plan_tensor: output {v.name!r} of model {model.name!r} is a model input or "
                                    f"weight; only node outputs can be sharded models' outputs")
        outputs.append(rw._materialise(v.name))
    for w in rw.out_weights.values():
        rw.specs[w.name] = w.spec
    for item in rw.items:               # collective outputs get their specs now
        if isinstance(item, Collective):
            rw._spec(item.dst)
    steps = _stages(rw.items, outputs, rw.out_weights, rw.specs, f"{model.name}.rank{rank}")
    return RankPlan(rank, steps, sum(w.nbytes for w in rw.out_weights.values()), rw.sharded,
                    [v.name for v in model.inputs], outputs, rw.specs)


# ---------------------------------------------------------------------------------------------- running

def _on(ctx):
    from ..context import RUNTIME
    return RUNTIME.using(ctx)


def _fits(shape, declared) -> bool:
    return len(shape) == len(declared) and all(w in (-1, d) for d, w in zip(shape, declared))


class _Rank:
    """One rank driven by this process: its communicator, stream and loaded stage models."""

    def __init__(self, comm, steps: list):
        import rt
        self.comm = comm
        self.steps = steps
        self.ids: dict[int, int] = {}
        with _on(comm.ctx):
            self.stream = rt.create_stream()
            try:
                for i, step in enumerate(steps):
                    if isinstance(step, fmt.ModelDef):
                        self.ids[i] = api.load_from_mem(fmt.serialize(step))
            except BaseException:
                self.unload()
                raise

    def unload(self) -> None:
        import rt
        with _on(self.comm.ctx):
            for model_id in self.ids.values():
                api.unload(model_id)
            self.ids.clear()
            if self.stream is not None:
                rt.destroy_stream(self.stream)
                self.stream = None

    def run(self, feeds: dict, batch_gear: int | None = None) -> dict:
        """Enqueue every step on this rank's stream; returns the device tensor of every value made."""
        import hccl
        import rt
        from .executor import infer_shapes
        bufs: dict = {}
        with _on(self.comm.ctx):
            for name, arr in feeds.items():
                t = bufs[name] = rt.empty(arr.shape, arr.dtype)
                if arr.nbytes:
                    rt.memcpy_async(t.ptr, t.nbytes, arr, arr.nbytes, rt.ACL_MEMCPY_HOST_TO_DEVICE, self.stream)
            for i, step in enumerate(self.steps):
                if isinstance(step, Collective):
                    src = bufs[step.src]
                    code = hccl.types.hccl_dtype(src.dtype)
                    if step.kind == "all_reduce":
                        dst = bufs[step.dst] = rt.empty(src.shape, src.dtype)
                        hccl.all_reduce(src.ptr, dst.ptr, src.size, code, "sum", self.comm, self.stream)
                    else:
                        dst = bufs[step.dst] = rt.empty((self.comm.size, *src.shape), src.dtype)
                        hccl.all_gather(src.ptr, dst.ptr, src.size, code, self.comm, self.stream)
                    continue
                shapes = [bufs[v.name].shape for v in step.inputs]
                specs = infer_shapes(dataclasses.replace(step, batch_sizes=()), shapes)
                ds_in, ds_out = api.create_dataset(), api.create_dataset()
                for v in step.inputs:
                    t = bufs[v.name]
                    api.add_dataset_buffer(ds_in, api.create_data_buffer(t.ptr, t.nbytes))
                for v in step.outputs:
                    t = bufs[v.name] = rt.empty(specs[v.name].shape, specs[v.name].dtype)
                    api.add_dataset_buffer(ds_out, api.create_data_buffer(t.ptr, t.nbytes))
                if batch_gear is not None:
                    api.set_dynamic_batch_size(self.ids[i], ds_in, 0, batch_gear)
                else:
                    for k, v in enumerate(step.inputs):
                        if -1 in v.shape:
                            api.set_input_dynamic_dims(self.ids[i], ds_in, k, list(shapes[k]))
                api.execute_async(self.ids[i], ds_in, ds_out, self.stream)
        return bufs

    def free(self, bufs: dict) -> None:
        import rt
        with _on(self.comm.ctx):
            rt.synchronize_stream(self.stream)
            for t in bufs.values():
                t.free()


class ShardedModel:
    """A model loaded across the ranks of a communicator; see the module docstring."""

    def __init__(self, model: fmt.ModelDef, comms: list, mode: str, min_shard_bytes: int):
        self.model, self.mode = model, mode
        self.world = comms[0].size
        self.plans: dict[int, RankPlan] = {}
        self.ranks: list[_Rank] = []
        try:
            for comm in comms:
                if mode == "tensor":
                    plan = plan_tensor(model, self.world, comm.rank, min_shard_bytes=min_shard_bytes)
                else:
                    plan = RankPlan(comm.rank, [model], model.weight_bytes, [], [v.name for v in model.inputs],
                                    [v.name for v in model.outputs])
                self.plans[comm.rank] = plan
                self.ranks.append(_Rank(comm, plan.steps))
        except BaseException:
            self.unload()
            raise

    @property
    def weight_bytes(self) -> dict[int, int]:
        """Bytes of weights each local rank holds."""
        return {rank: plan.weight_bytes for rank, plan in self.plans.items()}

    def _check_inputs(self, inputs) -> list[np.ndarray]:
        model = self.model
        if isinstance(inputs, dict):
            missing = [v.name for v in model.inputs if v.name not in inputs]
            if missing:
                raise AclError(AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                               f"ShardedModel.execute: inputs {missing} of model {model.name!r} not given")
            inputs = [inputs[v.name] for v in model.inputs]
        inputs = [np.ascontiguousarray(a) for a in inputs]
        if len(inputs) != len(model.inputs):
            raise AclError(AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                           f"ShardedModel.execute: got {len(inputs)} inputs, model {model.name!r} has "
                           f"{len(model.inputs)} ({[v.name for v in model.inputs]})")
        for a, v in zip(inputs, model.inputs):
            if a.dtype != v.dtype or not _fits(a.shape, v.shape):
                raise AclError(AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                               f"ShardedModel.execute: input {v.name!r} is {a.dtype}{list(a.shape)}, "
                               f"expected {v.dtype}{list(v.shape)}")
        return inputs

    def execute(self, inputs) -> list[np.ndarray]:
        """Run on every local rank (blocking) with the same host ``inputs`` (list or name → array);
        returns the model outputs, which every rank holds in full."""
        inputs = self._check_inputs(inputs)
        if self.mode == "batch":
            return self._execute_batch(inputs)
        runs = [(rank, rank.run(dict(zip(self.plans[rank.comm.rank].inputs, inputs)))) for rank in self.ranks]
        try:
            first, bufs = runs[0]
            with _on(first.comm.ctx):
                import rt
                rt.synchronize_stream(first.stream)
            return [bufs[name].numpy(sync=False) for name in self.plans[first.comm.rank].outputs]
        finally:
            for rank, bufs in runs:
                rank.free(bufs)

    def _local_batch(self, batch: int) -> tuple[int, int | None]:
        """(rows per rank, batch gear or None) for a global batch."""
        model, n = self.model, self.world
        want = -(-batch // n)
        if model.batch_sizes:
            fit = [g for g in model.batch_sizes if g >= want]
            if not fit:
                raise AclError(AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                               f"ShardedModel.execute: batch {batch} over {n} ranks needs {want} rows per rank, "
                               f"more than the largest gear {max(model.batch_sizes)} of model {model.name!r}")
            return min(fit), min(fit)
        dim0 = model.inputs[0].shape[0]
        if dim0 == -1:
            return want, None
        if batch > dim0 * n:
            raise AclError(AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                           f"ShardedModel.execute: batch {batch} exceeds {n} ranks x the static batch {dim0} "
                           f"of model {model.name!r}")
        return dim0, None

    def _execute_batch(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        import hccl
        import rt
        model, n = self.model, self.world
        if any(not a.ndim for a in inputs) or len({a.shape[0] for a in inputs}) != 1:
            raise AclError(AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                           f"ShardedModel.execute (batch mode): every input needs the same dim 0, got "
                           f"{[list(a.shape) for a in inputs]}")
        batch = inputs[0].shape[0]
        local, gear = self._local_batch(batch)
        padded = []
        for a in inputs:
            p = np.zeros((local * n, *a.shape[1:]), a.dtype)
            p[:batch] = a
            padded.append(p)
        runs = []
        for rank in self.ranks:
            r = rank.comm.rank
            feeds = {v.name: p[r * local:(r + 1) * local] for v, p in zip(model.inputs, padded)}
            bufs = rank.run(feeds, batch_gear=gear)
            with _on(rank.comm.ctx):
                for v in model.outputs:
                    out = bufs[v.name]
                    if not out.shape or out.shape[0] != local:
                        raise AclError(INVALID, f"ShardedModel (batch mode): output {v.name!r} has shape "
                                                f"{list(out.shape)}, not {local} rows of the batch slice")
                    dst = bufs[f"{v.name}::gathered"] = rt.empty((n, *out.shape), out.dtype)
                    hccl.all_gather(out.ptr, dst.ptr, out.size, hccl.types.hccl_dtype(out.dtype), rank.comm,
                                    rank.stream)
            runs.append((rank, bufs))
        try:
            first, bufs = runs[0]
            with _on(first.comm.ctx):
                rt.synchronize_stream(first.stream)
            results = []
            for v in model.outputs:
                g = bufs[f"{v.name}::gathered"].numpy(sync=False)
                results.append(g.reshape((n * local, *g.shape[2:]))[:batch])
            return results
        finally:
            for rank, bufs in runs:
                rank.free(bufs)

    def unload(self) -> None:
        """Unload every stage model and release the streams."""
        for rank in self.ranks:
            rank.unload()
        self.ranks = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unload()

    def __repr__(self) -> str:
        return (f"ShardedModel({self.model.name!r}, mode={self.mode!r}, world {self.world}, local ranks "
                f"{sorted(self.plans)}, weight bytes per rank {self.weight_bytes})")


def load_sharded(model, comm, mode: str = "tensor", *, min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES) -> ShardedModel:
    """Load ``model`` (a path, the file's bytes or a ModelDef) across the ranks of ``comm``.

    ``comm`` is this process's Communicator (one rank per process, as under ``launch``) or a list
    of Communicators of one communicator (one process driving several cards, ``comm_init_all``).
    ``mode`` is ``"tensor"`` (weights split Megatron-style) or ``"batch"`` (a full copy per card).
    Every rank of the communicator must call it (collectively, like the collectives it issues).
    """
    from hccl.comm import Communicator
    comms = list(comm) if isinstance(comm, (list, tuple)) else [comm]
    if not comms or not all(isinstance(c, Communicator) and not c.destroyed for c in comms):
        raise AclError(INVALID, f"load_sharded: comm must be a live hccl Communicator or a list of them, got {comm!r}")
    if len({c.id for c in comms}) != 1 or len({c.rank for c in comms}) != len(comms):
        raise AclError(INVALID, "load_sharded: the communicators must be distinct ranks of one communicator")
    if not isinstance(mode, str) or mode not in ("tensor", "batch"):
        raise AclError(INVALID, f"load_sharded: mode {mode!r}, expected 'tensor' or 'batch'")
    if isinstance(min_shard_bytes, bool) or not isinstance(min_shard_bytes, int) or min_shard_bytes < 0:
        raise AclError(INVALID, f"load_sharded: min_shard_bytes={min_shard_bytes!r}, expected an int >= 0")
    return ShardedModel(_as_model(model), sorted(comms, key=lambda c: c.rank), mode, min_shard_bytes)
