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
  so every rank returns the full batch. The global batch may be up to the world size times that
  (a static batch-1 model over 8 cards takes 1 to 8 images); more is refused (100017).
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

from rt import args
from rt.constants import AclErrorCode
from rt.errors import AclError
from rt.kernels import registry
from rt.mdl import format as fmt

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


def as_model(model) -> fmt.ModelDef:
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
    model = as_model(model)
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
