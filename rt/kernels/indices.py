"""Ops that make shape, index and constant tensors (ONNX semantics): Shape, ConstantOfShape, Range,
ArgMax, ArgMin, TopK (``K`` an attribute), GatherElements.

ConstantOfShape and Range take no input tensors here: their ONNX inputs are attributes of the same
names (ConstantOfShape's ``input``, also accepted as ``shape``; Range's ``start``, ``limit``,
``delta``), so the output shape is known before launch. The
output dtype, which ONNX takes from the ``value`` tensor or from the inputs, is the ``dtype``
attribute (a dtype name or ACL dtype code); without it, an int ``value``/int bounds give int64, a
float gives float32 and a bool gives bool.
"""

from __future__ import annotations

import math

import numpy as np

from ..dtypes import np_dtype
from ..errors import AclError
from .common import (
    ALL,
    F32,
    F64,
    NUMERIC,
    attr_bool,
    attr_float,
    attr_int,
    attr_ints,
    check_dtype,
    define,
    invalid,
    norm_axis,
    unsupported,
    wide,
    wrap_indices,
)
from .opdef import TensorSpec

I64 = np.dtype(np.int64)
RANGE_DTYPES = (F32, F64) + tuple(np.dtype(t) for t in (np.int16, np.int32, np.int64))


def _dtype_attr(op: str, attrs: dict, allowed, default: np.dtype) -> np.dtype:
    value = attrs.get("dtype")
    if value is None:
        return default
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    try:
        dtype = np_dtype(value)
    except AclError as exc:
        raise unsupported(op, f"attribute dtype={value!r}: {exc.message}") from None
    if dtype not in allowed:
        raise unsupported(op, f"attribute dtype={value!r} is {dtype}, expected one of: "
                              f"{', '.join(map(str, allowed))}")
    return dtype


def _check_fits(op: str, key: str, value, dtype: np.dtype) -> None:
    """An int-typed value must be a whole number within the dtype's range (floats round as numpy does)."""
    if dtype.kind not in "iu" or isinstance(value, (bool, np.bool_)):
        return
    if not np.isfinite(float(value)) or not float(value).is_integer():
        raise invalid(op, f"{key}={value!r} is not an integer but dtype is {dtype}")
    info = np.iinfo(dtype)
    if not info.min <= int(value) <= info.max:
        raise invalid(op, f"{key}={value!r} does not fit {dtype} ({info.min}..{info.max})")


def _natural(value) -> np.dtype:
    if isinstance(value, (bool, np.bool_)):
        return np.dtype(np.bool_)
    return I64 if isinstance(value, (int, np.integer)) else F32


# ---------------------------------------------------------------- Shape

def _shape_bounds(attrs: dict, rank: int) -> tuple[int, int]:
    start, end = attr_int("Shape", attrs, "start", 0), attr_int("Shape", attrs, "end", rank)
    start, end = (v + rank if v < 0 else v for v in (start, end))
    return min(max(start, 0), rank), min(max(end, 0), rank)


def _shape_infer(specs, attrs):
    (x,) = specs
    check_dtype("Shape", "data", x, ALL)
    start, end = _shape_bounds(attrs, len(x.shape))
    return [TensorSpec((max(end - start, 0),), I64)]


def _shape_compute(inputs, outputs, attrs):
    """shape = the dims of data as int64, from ``start`` to ``end`` (clamped, negatives count from the end)."""
    start, end = _shape_bounds(attrs, inputs[0].ndim)
    outputs[0][...] = np.asarray(inputs[0].shape[start:end], I64).reshape(outputs[0].shape)


define("Shape", "shape", _shape_infer, _shape_compute, attrs=("start", "end"))


# ---------------------------------------------------------------- ConstantOfShape

def _fill_value(attrs: dict):
    value = attrs.get("value", 0.0)
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise invalid("ConstantOfShape", f"attribute value={value!r} (expected one number)")
        value = value[0]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    attr_float("ConstantOfShape", {"value": value}, "value")
    return value


def _cos_infer(specs, attrs):
    key = "input" if attrs.get("input") is not None else "shape"
    shape = attr_ints("ConstantOfShape", attrs, key)
    if any(d < 0 for d in shape):
        raise invalid("ConstantOfShape", f"{key} {shape} has a negative dim")
    value = _fill_value(attrs)
    dtype = _dtype_attr("ConstantOfShape", attrs, ALL, _natural(value))
    _check_fits("ConstantOfShape", "value", value, dtype)
    return [TensorSpec(tuple(shape), dtype)]


def _cos_compute(inputs, outputs, attrs):
    """output = a tensor of shape ``input`` (or ``shape``) filled with ``value`` (default 0.0)."""
    outputs[0][...] = _fill_value(attrs)


define("ConstantOfShape", "constant_of_shape", _cos_infer, _cos_compute, attrs=("input", "shape", "value", "dtype"),
       min_inputs=0)


# ---------------------------------------------------------------- Range

def _range_params(attrs: dict):
    values = [attrs.get(k) for k in ("start", "limit", "delta")]
    for key in ("start", "limit", "delta"):
        attr_float("Range", attrs, key)
    natural = I64 if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values) else F32
    dtype = _dtype_attr("Range", attrs, RANGE_DTYPES, natural)
    for key, value in zip(("start", "limit", "delta"), values):
        if not np.isfinite(float(value)):
            raise invalid("Range", f"{key}={value!r} (expected a finite number)")
        _check_fits("Range", key, value, dtype)
    start, limit, delta = (dtype.type(v) for v in values)
    if delta == 0:
        raise invalid("Range", "delta=0 (expected a non-zero step)")
    count = max(math.ceil((float(limit) - float(start)) / float(delta)), 0)
    return start, delta, count, dtype


def _range_infer(specs, attrs):
    _, _, count, dtype = _range_params(attrs)
    return [TensorSpec((count,), dtype)]


def _range_compute(inputs, outputs, attrs):
    """output[i] = start + i·delta for i < max(ceil((limit - start) / delta), 0)."""
    start, delta, count, dtype = _range_params(attrs)
    outputs[0][...] = (start + np.arange(count, dtype=F64 if dtype in (F32, F64) else I64) * delta).astype(dtype)


define("Range", "arange", _range_infer, _range_compute, attrs=("start", "limit", "delta", "dtype"), min_inputs=0)


# ---------------------------------------------------------------- ArgMax / ArgMin

def _arg(name: str, snake: str, fn) -> None:
    def params(attrs, rank):
        axis = norm_axis(name, attr_int(name, attrs, "axis", 0), rank)
        return axis, attr_bool(name, attrs, "keepdims", True), attr_bool(name, attrs, "select_last_index", False)

    def infer(specs, attrs):
        (x,) = specs
        check_dtype(name, "data", x, NUMERIC)
        axis, keep, _ = params(attrs, len(x.shape))
        if x.shape[axis] == 0:
            raise invalid(name, f"axis {axis} of data {x.shape} is empty (no {fn.__name__[3:]} to find)")
        shape = tuple(1 if i == axis else d for i, d in enumerate(x.shape)) if keep else \
            x.shape[:axis] + x.shape[axis + 1:]
        return [TensorSpec(shape, I64)]

    def compute(inputs, outputs, attrs):
        x = wide(inputs[0])
        axis, _, last = params(attrs, x.ndim)
        if last:  # the last of equal extremes: search the reversed axis, map back
            idx = x.shape[axis] - 1 - fn(np.flip(x, axis=axis), axis=axis, keepdims=True)
        else:
            idx = fn(x, axis=axis, keepdims=True)
        outputs[0][...] = idx.reshape(outputs[0].shape)

    compute.__doc__ = (f"reduced = int64 index of the {'largest' if fn is np.argmax else 'smallest'} element "
                       f"along ``axis`` (the first one, or the last with select_last_index=1).")
    define(name, snake, infer, compute, attrs=("axis", "keepdims", "select_last_index"))


_arg("ArgMax", "argmax", np.argmax)
_arg("ArgMin", "argmin", np.argmin)


# ---------------------------------------------------------------- TopK

def _topk_params(x_shape: tuple[int, ...], attrs: dict):
    axis = norm_axis("TopK", attr_int("TopK", attrs, "axis", -1), len(x_shape))
    k = attr_int("TopK", attrs, "K")
    if k < 0 or (x_shape[axis] >= 0 and k > x_shape[axis]):
        raise invalid("TopK", f"K={k} for axis {axis} of size {x_shape[axis]} (expected 0 <= K <= {x_shape[axis]})")
    return axis, k, attr_bool("TopK", attrs, "largest", True), attr_bool("TopK", attrs, "sorted", True)


def _topk_infer(specs, attrs):
    (x,) = specs
    check_dtype("TopK", "X", x, NUMERIC)
    if not x.shape:
        raise invalid("TopK", "X is a scalar (expected rank >= 1)")
    axis, k, _, _ = _topk_params(x.shape, attrs)
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return [TensorSpec(shape, x.dtype), TensorSpec(shape, I64)]


def _topk_compute(inputs, outputs, attrs):
    """Values, Indices = the K largest (or smallest, largest=0) elements along ``axis`` (default -1),
    in order; equal values keep the lower index first. ``K`` is an attribute (an input in ONNX)."""
    x = wide(inputs[0])
    axis, k, largest, _ = _topk_params(x.shape, attrs)
    # descending = ascending of the negation, taken in a type where the lowest int cannot wrap
    keys = -x.astype(F64 if x.dtype.kind == "f" else np.int64) if largest else x
    idx = np.take(np.argsort(keys, axis=axis, kind="stable"), np.arange(k), axis=axis)
    outputs[0][...] = np.take_along_axis(x, idx, axis=axis)
    outputs[1][...] = idx


define("TopK", "topk", _topk_infer, _topk_compute, attrs=("K", "axis", "largest", "sorted"))


# ---------------------------------------------------------------- GatherElements

def _gather_elements_infer(specs, attrs):
    data, indices = specs
    check_dtype("GatherElements", "data", data, ALL)
    check_dtype("GatherElements", "indices", indices, (np.dtype(np.int32), I64))
    rank = len(data.shape)
    if rank == 0 or len(indices.shape) != rank:
        raise invalid("GatherElements", f"indices has shape {indices.shape} and data {data.shape} (expected the "
                                        f"same rank, >= 1)")
    axis = norm_axis("GatherElements", attr_int("GatherElements", attrs, "axis", 0), rank)
    for i, (d, n) in enumerate(zip(data.shape, indices.shape)):
        if i != axis and d >= 0 and n >= 0 and n > d:
            raise invalid("GatherElements", f"indices {indices.shape} is larger than data {data.shape} on dim {i}")
    return [TensorSpec(indices.shape, data.dtype)]


def _gather_elements_compute(inputs, outputs, attrs):
    """output[i][j][k] = data[index][j][k] (axis 0; likewise on ``axis``), index = indices[i][j][k];
    negative indices count from the end."""
    data, indices = inputs
    axis = norm_axis("GatherElements", attr_int("GatherElements", attrs, "axis", 0), data.ndim)
    idx = wrap_indices("GatherElements", indices, data.shape[axis], axis).astype(np.intp)
    sub = data[tuple(slice(0, n) if i != axis else slice(None) for i, n in enumerate(indices.shape))]
    outputs[0][...] = np.take_along_axis(sub, idx, axis=axis)


define("GatherElements", "gather_elements", _gather_elements_infer, _gather_elements_compute, attrs=("axis",),
       min_inputs=2)
