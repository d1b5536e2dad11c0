"""Convolution-network layers: Conv (N-d, groups, dilations, pads/auto_pad, bias),
BatchNormalization (inference form) and InstanceNormalization, with ONNX semantics.

Conv runs as im2col + one matrix product per group through BLAS: the patches are gathered as
strided slices of the padded input (channels last; one strided-window copy when a group has few
channels), never by a loop over pixels. A 1×1 unit-stride convolution needs no patch copy, and one
with a single input channel per group (depthwise) accumulates ``kernel_size`` scaled slices instead.
fp16/bf16 compute in float32.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .common import FLOATS, attr_float, attr_int, attr_ints, check_dtype, define, invalid, known, same_dtype, wide
from .opdef import TensorSpec
from .spatial import Window, check_spatial_input, offsets, padded, padded_last, window

SMALL_CHANNELS = 16  # below this many input channels per group, im2col copies channels-first windows
CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


# ---------------------------------------------------------------- Conv

def _conv_geometry(specs: list[TensorSpec], attrs: dict):
    x, w = specs[:2]
    check_dtype("Conv", "X", x, FLOATS)
    dtype = same_dtype("Conv", [("X", x), ("W", w)] + ([("B", specs[2])] if len(specs) == 3 else []))
    spatial = check_spatial_input("Conv", x.shape)
    if len(w.shape) != len(x.shape):
        raise invalid("Conv", f"W has shape {w.shape} but X has rank {len(x.shape)} {x.shape} "
                              f"(expected W of shape (M, C/group, k1, ..., k{len(spatial)}))")
    if not known(*w.shape):
        raise invalid("Conv", f"W has dynamic shape {w.shape} (expected a known weight shape)")
    group = attr_int("Conv", attrs, "group", 1)
    m, c_per_group, kernel = w.shape[0], w.shape[1], tuple(w.shape[2:])
    if any(k < 1 for k in kernel):
        raise invalid("Conv", f"W has shape {w.shape}: kernel dims {list(kernel)} (expected each >= 1)")
    if group < 1 or m % group:
        raise invalid("Conv", f"group={group} (expected >= 1 and dividing the {m} output channels of W)")
    if x.shape[1] >= 0 and x.shape[1] != c_per_group * group:
        raise invalid("Conv", f"X has {x.shape[1]} channels (shape {x.shape}) but W {w.shape} with group={group} "
                              f"expects {c_per_group * group} (W.shape[1] * group)")
    given = attr_ints("Conv", attrs, "kernel_shape", None)
    if given is not None and tuple(given) != kernel:
        raise invalid("Conv", f"attribute kernel_shape={given} but W has spatial shape {list(kernel)}")
    if len(specs) == 3 and specs[2].shape not in ((m,), (-1,)):
        raise invalid("Conv", f"B has shape {specs[2].shape} (expected ({m},), one bias per output channel)")
    win = window("Conv", attrs, spatial, kernel)
    return dtype, group, win


def _conv_infer(specs, attrs):
    dtype, _, win = _conv_geometry(specs, attrs)
    x, w = specs[:2]
    return [TensorSpec((x.shape[0], w.shape[0]) + win.out, dtype)]


def _conv_compute(inputs, outputs, attrs):
    """Y = X ⋆ W (+ B): cross-correlation over the spatial dims, ``group`` channel groups, ``strides``,
    ``dilations``, zero ``pads`` (or ``auto_pad``); W is (M, C/group, k1, ...), B is (M,)."""
    _, group, win = _conv_geometry([TensorSpec(a.shape, a.dtype) for a in inputs], attrs)
    x, w = wide(inputs[0]), wide(inputs[1])
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg, k = c // group, m // group, math.prod(win.kernel)
    p = math.prod(win.out)
    if cg == 1 and k > 1:  # depthwise: one input channel per group, k scaled slices
        xp = padded(x, win, 0.0)
        wk = w.reshape(group, mg, k)
        y = np.zeros((n, group, mg) + win.out, x.dtype)
        for i, sl in offsets(win):
            taps = xp[(slice(None), slice(None)) + sl].reshape((n, group, 1) + win.out)
            y += wk[:, :, i].reshape((1, group, mg) + (1,) * len(win.out)) * taps
        if len(inputs) == 3:
            y += wide(inputs[2]).reshape((1, group, mg) + (1,) * len(win.out))
        y = y.reshape(n, m, p)
    else:
        y = _im2col_matmul(x, w, win, group)  # (N, P, M)
        if len(inputs) == 3:
            y += wide(inputs[2])
        y = y.transpose(0, 2, 1)
    out = outputs[0]
    target = out.reshape(n, m, p)  # a view of a contiguous output: one copy, straight into it
    if np.shares_memory(target, out):
        target[...] = y
    else:
        out[...] = y.reshape(out.shape)


def _im2col_matmul(x: np.ndarray, w: np.ndarray, win: Window, group: int) -> np.ndarray:
    """(N, P, M) result of the convolution of ``x`` by ``w``: per group, the patches as an
    (N·P, C/group·k) matrix times the weights, with BLAS's long dimension first.
    Few channels (an RGB stem): one strided-window copy, channels first. Many: the input padded
    channels last, each kernel offset copying contiguous channel runs."""
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg, k, p = c // group, m // group, math.prod(win.kernel), math.prod(win.out)
    nd = len(win.out)
    few = cg < SMALL_CHANNELS
    if few:
        xp = padded(x, win, 0.0)
    else:
        x_last = padded_last(x, win, 0.0)  # (N, *padded S, C)
    y = np.empty((n * p, m), x.dtype)
    for g in range(group):
        wg = w[g * mg:(g + 1) * mg].reshape(mg, cg, k)
        if few:
            spans = tuple((kk - 1) * d + 1 for kk, d in zip(win.kernel, win.dilations))
            view = sliding_window_view(xp[:, g * cg:(g + 1) * cg], spans, axis=tuple(range(2, 2 + nd)))
            view = view[(slice(None), slice(None))
                        + tuple(slice(0, (o - 1) * s_ + 1, s_) for o, s_ in zip(win.out, win.strides))
                        + tuple(slice(None, None, d) for d in win.dilations)]
            order = (0,) + tuple(range(2, 2 + nd)) + (1,) + tuple(range(2 + nd, 2 + 2 * nd))
            cols = view.transpose(order).reshape(n * p, cg * k)  # (N, *out, C, *kernel): one copy
            wg = wg.reshape(mg, cg * k)
        elif k == 1 and all(s_ == 1 for s_ in win.strides):
            cols = x_last[..., g * cg:(g + 1) * cg].reshape(n * p, cg)  # 1×1, unit stride: no copy needed
            wg = wg.reshape(mg, cg)
        else:
            xg = x_last[..., g * cg:(g + 1) * cg]
            cols = np.empty((n,) + win.out + (k, cg), x.dtype)
            for i, sl in offsets(win):
                cols[..., i, :] = xg[(slice(None),) + sl]
            cols = cols.reshape(n * p, k * cg)
            wg = wg.transpose(0, 2, 1).reshape(mg, k * cg)
        if n * p >= mg:
            np.matmul(cols, wg.T, out=y[:, g * mg:(g + 1) * mg])
        else:  # few output positions (a deep layer at batch 1): BLAS does better with the weights first
            y[:, g * mg:(g + 1) * mg] = (wg @ cols.T).T
    return y.reshape(n, p, m)


define("Conv", "conv", _conv_infer, _conv_compute, attrs=CONV_ATTRS, min_inputs=2, max_inputs=3)


# ---------------------------------------------------------------- BatchNormalization (inference)

BN_INPUTS = ("scale", "B", "input_mean", "input_var")


def _bn_check(specs, attrs) -> None:
    x = specs[0]
    check_dtype("BatchNormalization", "X", x, FLOATS)
    if len(x.shape) < 2:
        raise invalid("BatchNormalization", f"X has shape {x.shape} (expected (N, C, ...), rank >= 2)")
    channels = x.shape[1]
    for name, spec in zip(BN_INPUTS, specs[1:]):
        check_dtype("BatchNormalization", name, spec, FLOATS)
        if len(spec.shape) != 1 or (known(channels, spec.shape[0]) and spec.shape[0] != channels):
            raise invalid("BatchNormalization", f"{name} has shape {spec.shape} but X {x.shape} has "
                                                f"{channels} channels (expected ({channels},))")
    if attr_int("BatchNormalization", attrs, "training_mode", 0) != 0:
        raise invalid("BatchNormalization", f"training_mode={attrs['training_mode']} (only inference, "
                                            f"training_mode=0, is supported)")
    if attr_float("BatchNormalization", attrs, "epsilon", 1e-5) < 0:
        raise invalid("BatchNormalization", f"epsilon={attrs['epsilon']} (expected >= 0)")
    attr_float("BatchNormalization", attrs, "momentum", 0.9)  # a training-only setting: type-checked


def _bn_infer(specs, attrs):
    _bn_check(specs, attrs)
    return [TensorSpec(specs[0].shape, specs[0].dtype)]


def _bn_compute(inputs, outputs, attrs):
    """Y = (X - input_mean) / sqrt(input_var + epsilon) · scale + B, per channel (dim 1)."""
    x = wide(inputs[0])
    scale, bias, mean, var = (wide(a).astype(x.dtype) for a in inputs[1:])
    eps = attr_float("BatchNormalization", attrs, "epsilon", 1e-5)
    factor = scale / np.sqrt(var + x.dtype.type(eps))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    outputs[0][...] = x * factor.reshape(shape) + (bias - mean * factor).reshape(shape)


define("BatchNormalization", "batch_normalization", _bn_infer, _bn_compute,
       attrs=("epsilon", "momentum", "training_mode"), min_inputs=5)


# ---------------------------------------------------------------- InstanceNormalization

def _in_infer(specs, attrs):
    x, scale, bias = specs
    check_dtype("InstanceNormalization", "input", x, FLOATS)
    same_dtype("InstanceNormalization", [("input", x), ("scale", scale), ("B", bias)])
    if len(x.shape) < 3:
        raise invalid("InstanceNormalization", f"input has shape {x.shape} (expected (N, C, D1, ...), rank >= 3)")
    for name, spec in (("scale", scale), ("B", bias)):
        if len(spec.shape) != 1 or (known(x.shape[1], spec.shape[0]) and spec.shape[0] != x.shape[1]):
            raise invalid("InstanceNormalization", f"{name} has shape {spec.shape} but input {x.shape} has "
                                                   f"{x.shape[1]} channels (expected ({x.shape[1]},))")
    if attr_float("InstanceNormalization", attrs, "epsilon", 1e-5) < 0:
        raise invalid("InstanceNormalization", f"epsilon={attrs['epsilon']} (expected >= 0)")
    return [TensorSpec(x.shape, x.dtype)]


def _in_compute(inputs, outputs, attrs):
    """output = scale · (input - mean) / sqrt(var + epsilon) + B, mean and (biased) var over the spatial
    dims of each sample and channel."""
    x = wide(inputs[0])
    scale, bias = (wide(a).astype(x.dtype) for a in inputs[1:])
    axes = tuple(range(2, x.ndim))
    count = math.prod(x.shape[2:])  # sum / count: an empty instance gives nan without a numpy warning
    centered = x - x.sum(axis=axes, keepdims=True) / count
    var = (centered * centered).sum(axis=axes, keepdims=True) / count
    shape = (1, -1) + (1,) * (x.ndim - 2)
    eps = attr_float("InstanceNormalization", attrs, "epsilon", 1e-5)
    outputs[0][...] = centered / np.sqrt(var + x.dtype.type(eps)) * scale.reshape(shape) + bias.reshape(shape)


define("InstanceNormalization", "instance_normalization", _in_infer, _in_compute, attrs=("epsilon",), min_inputs=3)
