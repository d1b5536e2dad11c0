"""Pooling: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool (ONNX semantics, N-d).

MaxPool and AveragePool take ``kernel_shape`` (required), ``strides``, ``dilations``, ``pads`` or
``auto_pad``, and ``ceil_mode``; AveragePool's ``count_include_pad=1`` divides by the window size
clipped to the explicitly padded input (the ceil_mode overhang never counts), ``0`` by the number
of real input elements in the window. MaxPool has one output (no ``Indices``) and
``storage_order=0``. fp16/bf16 average in float32; MaxPool also takes 8-bit ints, as ONNX.
"""

from __future__ import annotations

import math

import numpy as np

from .common import F32, FLOATS, attr_bool, attr_int, attr_ints, check_dtype, define, invalid, wide
from .opdef import TensorSpec
from .spatial import Window, check_spatial_input, offsets, padded, window

POOL_ATTRS = ("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides")
MAX_DTYPES = FLOATS + (np.dtype(np.int8), np.dtype(np.uint8))


def _pool_window(op: str, shape: tuple[int, ...], attrs: dict) -> Window:
    spatial = check_spatial_input(op, shape)
    kernel = attr_ints(op, attrs, "kernel_shape")
    if len(kernel) != len(spatial) or any(k < 1 for k in kernel):
        raise invalid(op, f"attribute kernel_shape={kernel} (expected {len(spatial)} values >= 1 for X of "
                          f"shape {shape})")
    return window(op, attrs, spatial, tuple(kernel), pool=True)


def _pool(name: str, snake: str, dtypes, extra_attrs: tuple[str, ...], reduce_fn, doc: str) -> None:
    def infer(specs, attrs):
        (x,) = specs
        check_dtype(name, "X", x, dtypes)
        if name == "MaxPool" and attr_int(name, attrs, "storage_order", 0) != 0:
            raise invalid(name, f"storage_order={attrs['storage_order']} (only 0, row major, is supported)")
        if name == "AveragePool":
            attr_bool(name, attrs, "count_include_pad", False)
        win = _pool_window(name, x.shape, attrs)
        return [TensorSpec(x.shape[:2] + win.out, x.dtype)]

    def compute(inputs, outputs, attrs):
        x = inputs[0]
        win = _pool_window(name, x.shape, attrs)
        outputs[0][...] = reduce_fn(x, win, attrs)

    compute.__doc__ = doc
    define(name, snake, infer, compute, attrs=POOL_ATTRS + extra_attrs)


def _max(x: np.ndarray, win: Window, attrs: dict) -> np.ndarray:
    low = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf  # bfloat16 is kind "V"
    xp = padded(x, win, low)
    y = None
    for _, sl in offsets(win):
        taps = xp[(slice(None), slice(None)) + sl]
        y = taps.copy() if y is None else np.maximum(y, taps, out=y)  # nan propagates, as max
    return y


def _window_sum(xp: np.ndarray, win: Window) -> np.ndarray:
    y = np.zeros(xp.shape[:2] + win.out, xp.dtype)
    for _, sl in offsets(win):
        y += xp[(slice(None), slice(None)) + sl]
    return y


def _avg(x: np.ndarray, win: Window, attrs: dict) -> np.ndarray:
    xw = wide(x)
    total = _window_sum(padded(xw, win, 0.0), win)
    # The divisor per output: a pooled map of ones over the explicitly padded input (pads count
    # as ones with count_include_pad=1, as zeros otherwise); the ceil_mode overhang is zeros.
    spatial = x.shape[2:]
    if attr_bool("AveragePool", attrs, "count_include_pad", False):
        ones = np.ones((1, 1) + tuple(n + b + e for n, b, e in zip(spatial, win.begin, win.end)), F32)
        count = _window_sum(_pad_overhang(ones, win, spatial), win)
    else:
        count = _window_sum(padded(np.ones((1, 1) + spatial, F32), win, 0.0), win)
    return total / count.astype(total.dtype)


def _pad_overhang(ones_p: np.ndarray, win: Window, spatial: tuple[int, ...]) -> np.ndarray:
    """``ones_p`` (the explicitly padded ones) grown with zeros by the ceil_mode overhang."""
    extra = win.extra(spatial)
    if not any(extra):
        return ones_p
    out = np.zeros(ones_p.shape[:2] + tuple(n + e for n, e in zip(ones_p.shape[2:], extra)), ones_p.dtype)
    out[(slice(None), slice(None)) + tuple(slice(0, n) for n in ones_p.shape[2:])] = ones_p
    return out


_pool("MaxPool", "max_pool", MAX_DTYPES, ("storage_order",), _max,
      "Y = max of each ``kernel_shape`` window of X (pads hold -inf: they never win).")
_pool("AveragePool", "average_pool", FLOATS, ("count_include_pad",), _avg,
      "Y = mean of each ``kernel_shape`` window of X (pads count only with count_include_pad=1).")


# ---------------------------------------------------------------- global pools

def _global(name: str, snake: str, dtypes, reduce_fn, doc: str) -> None:
    def infer(specs, attrs):
        (x,) = specs
        check_dtype(name, "X", x, dtypes)
        check_spatial_input(name, x.shape)
        return [TensorSpec(x.shape[:2] + (1,) * (len(x.shape) - 2), x.dtype)]

    def compute(inputs, outputs, attrs):
        x = wide(inputs[0])
        outputs[0][...] = reduce_fn(x, axis=tuple(range(2, x.ndim)), keepdims=True)

    compute.__doc__ = doc
    define(name, snake, infer, compute)


def _global_mean(x, axis, keepdims):
    return np.sum(x, axis=axis, keepdims=keepdims) / math.prod(x.shape[a] for a in axis)  # empty: nan, no warning


def _global_max(x, axis, keepdims):
    return np.max(x, axis=axis, keepdims=keepdims, initial=-np.inf)  # empty: -inf


_global("GlobalAveragePool", "global_average_pool", FLOATS, _global_mean,
        "Y = mean of X over all spatial dims; Y is (N, C, 1, ..., 1).")
_global("GlobalMaxPool", "global_max_pool", FLOATS, _global_max,
        "Y = max of X over all spatial dims; Y is (N, C, 1, ..., 1) (-inf over an empty one).")
