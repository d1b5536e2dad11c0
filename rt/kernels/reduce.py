"""Reductions: ReduceSum, ReduceMean, ReduceMax (ONNX-18 style: ``axes`` is an attribute here).

``axes`` absent or empty reduces every axis (unless noop_with_empty_axes=1, which makes the op
an identity); ``keepdims=1`` keeps reduced axes as size 1. fp16/bf16 accumulate in float32.
Reducing an empty set gives 0 (sum), nan (mean) or the dtype's lowest value, -inf for floats (max).
"""

from __future__ import annotations

import math

import numpy as np

from .common import FLOATS, NUMERIC, attr_bool, attr_ints, check_dtype, define, norm_axes, wide
from .opdef import TensorSpec


def reduced_axes(op: str, attrs: dict, rank: int) -> list[int]:
    """The axes to reduce, normalized; [] means "none" (noop_with_empty_axes=1)."""
    axes = attr_ints(op, attrs, "axes", None)
    if not axes:
        return [] if attr_bool(op, attrs, "noop_with_empty_axes", False) else list(range(rank))
    return norm_axes(op, axes, rank)


def reduced_shape(shape: tuple[int, ...], axes: list[int], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _lowest(dtype: np.dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


_REDUCERS = {
    "ReduceSum": lambda x, axes: np.sum(x, axis=axes, keepdims=True),
    # sum / count rather than np.mean: an empty set gives nan (0/0) without numpy's warning
    "ReduceMean": lambda x, axes: np.sum(x, axis=axes, keepdims=True) / math.prod(x.shape[a] for a in axes),
    "ReduceMax": lambda x, axes: np.max(x, axis=axes, keepdims=True, initial=_lowest(x.dtype)),
}


def _reduction(name: str, snake: str, dtypes, doc: str) -> None:
    reduce_fn = _REDUCERS[name]

    def infer(specs, attrs):
        (x,) = specs
        check_dtype(name, "data", x, dtypes)
        axes = reduced_axes(name, attrs, len(x.shape))
        return [TensorSpec(reduced_shape(x.shape, axes, attr_bool(name, attrs, "keepdims", True)), x.dtype)]

    def compute(inputs, outputs, attrs):
        x = wide(inputs[0])
        axes = reduced_axes(name, attrs, x.ndim)
        # Always reduce with keepdims, then drop dims by reshape: one code path for both settings.
        outputs[0][...] = reduce_fn(x, tuple(axes)).reshape(outputs[0].shape) if axes else x

    compute.__doc__ = doc
    define(name, snake, infer, compute, attrs=("axes", "keepdims", "noop_with_empty_axes"))


_reduction("ReduceSum", "reduce_sum", NUMERIC, "reduced = sum of data over ``axes`` (all by default).")
_reduction("ReduceMean", "reduce_mean", FLOATS, "reduced = mean of data over ``axes`` (all by default).")
_reduction("ReduceMax", "reduce_max", NUMERIC, "reduced = max of data over ``axes`` (all by default).")
