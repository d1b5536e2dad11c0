"""How each ONNX op becomes a card op: static parameter inputs turned into attributes, attribute spellings, and
lowerings of ops onto other kernels when the card has no kernel of that name.

- ``PARAM_INPUTS``: ONNX ops whose later inputs are static parameters (``Reshape``'s ``shape``, ``Slice``'s
  ``starts/ends/axes/steps``...). The card kernels take them as attributes of the same name, so they must be
  constant at conversion (after folding); an omitted optional input leaves the attribute out.
- ``attrs_for``: the node's attributes as the card kernel takes them (``Cast``'s ``to`` becomes a dtype name,
  since the card's Cast reads ACL dtype codes, not ONNX ones; ``Identity``-like training attributes dropped).
- ``LOWERINGS``: rewrites onto registered kernels, used only when the card has no kernel of the ONNX name
  (``GlobalAveragePool`` -> ``ReduceMean``; ``Flatten``/``Squeeze``/``Unsqueeze`` -> ``Reshape`` for their
  static target shape; ``BatchNormalization`` with constant statistics -> ``Mul`` + ``Add``).
"""

from __future__ import annotations

import math

import numpy as np

from .reader import onnx_dtype

_REDUCE = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSumExp", "ReduceSumSquare", "ReduceLogSum")

PARAM_INPUTS: dict[str, dict[int, str]] = {
    "Reshape": {1: "shape"},
    "Expand": {1: "shape"},
    "Slice": {1: "starts", 2: "ends", 3: "axes", 4: "steps"},
    "Split": {1: "split"},
    "Squeeze": {1: "axes"},
    "Unsqueeze": {1: "axes"},
    "Pad": {1: "pads", 2: "constant_value", 3: "axes"},
    "Resize": {1: "roi", 2: "scales", 3: "sizes"},
    "Upsample": {1: "scales"},
    "Clip": {1: "min", 2: "max"},
    "Tile": {1: "repeats"},
    "TopK": {1: "K"},
    "Trilu": {1: "k"},
    "CumSum": {1: "axis"},
    **{op: {1: "axes"} for op in _REDUCE},
}

SCALAR_PARAMS = {("Clip", "min"), ("Clip", "max"), ("Pad", "constant_value"), ("TopK", "K"), ("Trilu", "k"),
                 ("CumSum", "axis")}


def param_value(op: str, name: str, array: np.ndarray):
    """A constant parameter input as an attribute value (a list, or a scalar where ONNX takes a scalar)."""
    if (op, name) in SCALAR_PARAMS:
        return array.reshape(-1)[0].item()
    return array.reshape(-1).tolist() if array.ndim else [array.item()]


def attrs_for(op: str, attrs: dict) -> dict:
    """ONNX attributes as the card kernel of the same name takes them."""
    out = {k: v for k, v in attrs.items() if not hasattr(v, "node")}  # drop subgraphs (the op is refused anyway)
    if op == "Cast":
        out["to"] = str(onnx_dtype(int(attrs["to"]), "Cast 'to'"))
        out.pop("saturate", None)
    if op == "BatchNormalization":
        out.pop("training_mode", None)
        out.pop("spatial", None)
    if op == "Gelu" and "approximate" not in out:
        out["approximate"] = "none"
    return out


# --------------------------------------------------------------------------------------------- lowerings
# Each takes (builder, node, input Values, attrs, output names, constant arrays per input or None) and returns
# the output Values, or None when it cannot express this node; it is tried only when REGISTRY has no kernel
# named like the ONNX op.


def _reshape_to(g, x, target, name, out):
    """Reshape to a static target; a dynamic dim kept in place is written as 0 (copy), ONNX's convention."""
    shape = [0 if d == -1 and i < len(x.shape) and x.shape[i] == -1 else d for i, d in enumerate(target)]
    if shape.count(-1) > 1:
        return None
    return [g.op("Reshape", [x], outputs=out, name=name, shape=shape)]


def _flatten(g, node, xs, attrs, out, consts):
    (x,) = xs
    axis = attrs.get("axis", 1) % (len(x.shape) + 1) if x.shape else 0
    head, tail = x.shape[:axis], x.shape[axis:]
    target = [-1 if -1 in head else math.prod(head), -1 if -1 in tail else math.prod(tail)]
    if target == [-1, -1]:
        return None
    if -1 in head and len(head) == 1:
        target[0] = -1
    return _reshape_to(g, x, target, node.name, out)


def _squeeze(g, node, xs, attrs, out, consts):
    (x,) = xs
    axes = attrs.get("axes")
    rank = len(x.shape)
    drop = {a % rank for a in axes} if axes is not None else {i for i, d in enumerate(x.shape) if d == 1}
    return _reshape_to(g, x, [d for i, d in enumerate(x.shape) if i not in drop], node.name, out)


def _unsqueeze(g, node, xs, attrs, out, consts):
    (x,) = xs
    rank = len(x.shape) + len(attrs["axes"])
    axes = sorted(a % rank for a in attrs["axes"])
    target, rest = [], iter(x.shape)
    for i in range(rank):
        target.append(1 if i in axes else next(rest))
    return _reshape_to(g, x, target, node.name, out)


def _global_average_pool(g, node, xs, attrs, out, consts):
    (x,) = xs
    return [g.op("ReduceMean", [x], outputs=out, name=node.name, axes=list(range(2, len(x.shape))), keepdims=1)]


def _batch_norm(g, node, xs, attrs, out, consts):
    if any(c is None for c in consts[1:5]):
        return None  # statistics computed in the graph: only a BatchNormalization kernel can run it
    scale, bias, mean, var = (np.asarray(c, dtype=np.float64) for c in consts[1:5])
    eps = float(attrs.get("epsilon", 1e-5))
    x = xs[0]
    mul = scale / np.sqrt(var + eps)
    add = bias - mean * mul
    bshape = [-1] + [1] * (len(x.shape) - 2)
    m = g.constant(f"{node.name}/scale", mul.reshape(bshape).astype(x.dtype))
    a = g.constant(f"{node.name}/shift", add.reshape(bshape).astype(x.dtype))
    return [g.op("Add", [g.op("Mul", [x, m], name=f"{node.name}/mul"), a], outputs=out, name=node.name)]


def _dropout(g, node, xs, attrs, out, consts):
    return [g.op("Identity", [xs[0]], outputs=out[:1], name=node.name)]


LOWERINGS = {
    "Flatten": _flatten,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "GlobalAveragePool": _global_average_pool,
    "BatchNormalization": _batch_norm,
    "Dropout": _dropout,
}
