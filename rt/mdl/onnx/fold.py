"""Constant folding: ONNX nodes whose inputs are all known at conversion time, evaluated with numpy.

``torch.onnx.export`` writes shape arithmetic into the graph (``Shape -> Gather -> Unsqueeze -> Concat ->
Reshape``, ``ConstantOfShape``, ``Range`` for position ids, ``Cast`` chains...). With the input shapes fixed
by the model or ``--input_shape``, all of it is constant: the converter evaluates it here and the card never
sees it. ``FOLDERS`` maps an ONNX op type to ``fn(inputs, attrs) -> [outputs]``; inputs are numpy arrays (an
omitted optional input is ``None``).

A dim that stays dynamic (-1) folds to -1; :func:`fold` reports whether an output still carries one, and only
ops that move such values around (Gather, Concat, Unsqueeze...) may take them: arithmetic on an unknown dim
would silently compute garbage, so it is refused.
"""

from __future__ import annotations

import numpy as np

from .reader import onnx_dtype

MAX_FOLD_ELEMENTS = 1 << 28   # 1 GiB of float32: a folded constant larger than this is a broken model


def _bounded(dims) -> list[int]:
    dims = [int(d) for d in dims]
    if any(d < 0 for d in dims) or int(np.prod(dims, dtype=object)) > MAX_FOLD_ELEMENTS:
        raise ValueError(f"shape {dims} is negative or over {MAX_FOLD_ELEMENTS} elements")
    return dims


def _axes(attrs, inputs, index=1):
    if len(inputs) > index and inputs[index] is not None:
        return [int(a) for a in inputs[index]]
    axes = attrs.get("axes")
    return None if axes is None else [int(a) for a in axes]


def _constant(inputs, attrs):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in attrs:
            value = attrs[key]
            if key.startswith("value_int"):
                return [np.array(value, dtype=np.int64)]
            if key.startswith("value_float"):
                return [np.array(value, dtype=np.float32)]
            return [np.asarray(value)]
    raise ValueError(f"Constant has none of the supported value attributes (got {sorted(attrs)})")


def _constant_of_shape(inputs, attrs):
    value = attrs.get("value")
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return [np.full(_bounded(inputs[0]), fill[0], dtype=fill.dtype)]


def _unsqueeze(inputs, attrs):
    x, axes = inputs[0], _axes(attrs, inputs)
    rank = x.ndim + len(axes)
    for a in sorted(a % rank for a in axes):
        x = np.expand_dims(x, a)
    return [x]


def _squeeze(inputs, attrs):
    axes = _axes(attrs, inputs)
    x = inputs[0]
    return [np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(a % x.ndim for a in axes))]


def _slice(inputs, attrs):
    x = inputs[0]
    if len(inputs) > 1:
        starts, ends = inputs[1], inputs[2]
        axes = inputs[3] if len(inputs) > 3 and inputs[3] is not None else range(len(starts))
        steps = inputs[4] if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    else:  # Slice-1: attributes
        starts, ends = attrs["starts"], attrs["ends"]
        axes, steps = attrs.get("axes", range(len(starts))), [1] * len(starts)
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        s, e, st = int(s), int(e), int(st)
        # numpy clamps out-of-range bounds as ONNX does, except that INT64_MIN/MAX must fit a Python slice
        index[int(a) % x.ndim] = slice(s, None if (st < 0 and e < -x.shape[int(a)]) else e, st)
    return [x[tuple(index)]]


def _reshape(inputs, attrs):
    x, shape = inputs[0], [int(d) for d in inputs[1]]
    allowzero = attrs.get("allowzero", 0)
    shape = [x.shape[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
    return [x.reshape(shape)]


def _gather(inputs, attrs):
    x, idx = inputs
    return [np.take(x, idx.astype(np.int64), axis=int(attrs.get("axis", 0)))]


def _div(inputs, attrs):
    a, b = inputs
    if np.issubdtype(a.dtype, np.integer):
        return [(np.trunc(a / b)).astype(a.dtype)]  # C-style truncation, as onnxruntime divides integers
    return [a / b]


def _cast(inputs, attrs):
    return [inputs[0].astype(onnx_dtype(int(attrs["to"]), "Cast 'to'"))]


def _range(inputs, attrs):
    start, limit, delta = (x.item() for x in inputs)
    _bounded([max(0, int(np.ceil((limit - start) / delta)))] if delta else [-1])
    return [np.arange(start, limit, delta, dtype=inputs[0].dtype)]


def _tile(x, repeats):
    _bounded([d * r for d, r in zip(x.shape, repeats)])
    return np.tile(x, repeats)


def _shape_of(x_shape, attrs):
    start, end = attrs.get("start", 0), attrs.get("end")
    return np.array(x_shape[start:end], dtype=np.int64)


def _reduce(fn):
    def run(inputs, attrs):
        axes = _axes(attrs, inputs)
        keep = bool(attrs.get("keepdims", 1))
        if axes is None or len(axes) == 0:
            axes = None if not attrs.get("noop_with_empty_axes", 0) else ()
        if axes == ():
            return [inputs[0]]
        return [np.asarray(fn(inputs[0], axis=None if axes is None else tuple(axes), keepdims=keep))]
    return run


def _binary(fn):
    return lambda inputs, attrs: [np.asarray(fn(inputs[0], inputs[1])).astype(
        np.result_type(inputs[0], inputs[1]) if fn not in _BOOL_RESULT else np.bool_)]


_BOOL_RESULT = {np.equal, np.less, np.greater, np.less_equal, np.greater_equal, np.logical_and, np.logical_or,
                np.logical_xor}

FOLDERS = {
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "Identity": lambda inputs, attrs: [inputs[0]],
    "Cast": _cast,
    "Gather": _gather,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": lambda inputs, attrs: [np.concatenate([np.atleast_1d(x) if x.ndim == 0 else x for x in inputs],
                                                    axis=int(attrs.get("axis", 0)))],
    "Slice": _slice,
    "Reshape": _reshape,
    "Flatten": lambda inputs, attrs: [inputs[0].reshape(int(np.prod(inputs[0].shape[:attrs.get("axis", 1)])), -1)],
    "Transpose": lambda inputs, attrs: [np.transpose(inputs[0], attrs.get("perm"))],
    "Expand": lambda inputs, attrs: [inputs[0] * np.ones(_bounded(inputs[1]), dtype=inputs[0].dtype)],
    "Tile": lambda inputs, attrs: [_tile(inputs[0], [int(r) for r in inputs[1]])],
    "Range": _range,
    "Where": lambda inputs, attrs: [np.where(inputs[0], inputs[1], inputs[2])],
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply), "Div": _div,
    "Pow": lambda inputs, attrs: [np.power(inputs[0], inputs[1]).astype(inputs[0].dtype)],
    "Min": lambda inputs, attrs: [np.minimum.reduce(inputs)], "Max": lambda inputs, attrs: [np.maximum.reduce(inputs)],
    "Equal": _binary(np.equal), "Less": _binary(np.less), "Greater": _binary(np.greater),
    "LessOrEqual": _binary(np.less_equal), "GreaterOrEqual": _binary(np.greater_equal),
    "And": _binary(np.logical_and), "Or": _binary(np.logical_or), "Xor": _binary(np.logical_xor),
    "Not": lambda inputs, attrs: [np.logical_not(inputs[0])],
    "Neg": lambda inputs, attrs: [np.negative(inputs[0])], "Abs": lambda inputs, attrs: [np.abs(inputs[0])],
    "Sqrt": lambda inputs, attrs: [np.sqrt(inputs[0])], "Reciprocal": lambda inputs, attrs: [1 / inputs[0]],
    "Floor": lambda inputs, attrs: [np.floor(inputs[0])], "Ceil": lambda inputs, attrs: [np.ceil(inputs[0])],
    "ReduceProd": _reduce(np.prod), "ReduceSum": _reduce(np.sum), "ReduceMax": _reduce(np.max),
    "ReduceMin": _reduce(np.min),
}

# ops that only move values around: they may carry a dynamic dim's -1 without computing with it
MOVERS = {"Identity", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Reshape", "Flatten", "Cast",
          "Transpose"}

def fold(op: str, inputs: list, attrs: dict) -> list[np.ndarray]:
    """Evaluate one node over constants (raises whatever numpy raises for inconsistent operands)."""
    return [np.asarray(x) for x in FOLDERS[op](inputs, attrs)]


def shape_of(shape, attrs) -> np.ndarray:
    """ONNX Shape (with opset 15's start/end) of a tensor of this shape; dynamic dims are -1."""
    return _shape_of(list(shape), attrs)
