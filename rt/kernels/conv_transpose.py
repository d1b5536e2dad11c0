"""ConvTranspose (ONNX semantics, N-d): the gradient of Conv with respect to its input, as decoders
and upsampling layers use it.

X is (N, C, D1, ...), W is (C, M/group, k1, ...), B is (M,). Each output spatial dim is
``stride·(in - 1) + output_padding + (k - 1)·dilation + 1 - pad_begin - pad_end``; ``output_shape``
(spatial dims, or all dims) fixes it instead and derives the pads (the odd one at the end for
SAME_UPPER, at the beginning otherwise), and ``auto_pad`` SAME_UPPER/SAME_LOWER asks for
``in · stride``. The compute is one matrix product per group (input positions × C/group against
M/group·k weights, through BLAS), then one strided add per kernel offset (col2im).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .common import FLOATS, attr_int, attr_ints, attr_str, check_dtype, define, invalid, known, same_dtype, wide
from .opdef import TensorSpec
from .spatial import AUTO_PADS, check_spatial_input

ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads", "strides")


def _per_dim(attrs: dict, name: str, n: int, default: int, minimum: int) -> list[int]:
    values = attr_ints("ConvTranspose", attrs, name, None)
    if values is None:
        return [default] * n
    if len(values) != n or any(v < minimum for v in values):
        raise invalid("ConvTranspose", f"attribute {name}={values} (expected {n} values >= {minimum}, one per "
                                       f"spatial dim)")
    return values


def _geometry(specs: list[TensorSpec], attrs: dict):
    """(dtype, group, kernel, strides, dilations, pads_begin, output spatial dims) of a ConvTranspose."""
    x, w = specs[:2]
    check_dtype("ConvTranspose", "X", x, FLOATS)
    dtype = same_dtype("ConvTranspose", [("X", x), ("W", w)] + ([("B", specs[2])] if len(specs) == 3 else []))
    spatial = check_spatial_input("ConvTranspose", x.shape)
    nd = len(spatial)
    if len(w.shape) != len(x.shape) or not known(*w.shape) or any(k < 1 for k in w.shape[2:]):
        raise invalid("ConvTranspose", f"W has shape {w.shape} but X is {x.shape} (expected W of known shape "
                                       f"(C, M/group, k1, ..., k{nd}) with kernel dims >= 1)")
    group = attr_int("ConvTranspose", attrs, "group", 1)
    if group < 1 or (x.shape[1] >= 0 and x.shape[1] != w.shape[0]) or w.shape[0] % group:
        raise invalid("ConvTranspose", f"X has {x.shape[1]} channels, W is {w.shape}, group={group} (expected "
                                       f"W.shape[0] == channels, divisible by group)")
    m = w.shape[1] * group
    kernel = list(w.shape[2:])
    given = attr_ints("ConvTranspose", attrs, "kernel_shape", None)
    if given is not None and given != kernel:
        raise invalid("ConvTranspose", f"attribute kernel_shape={given} but W has spatial shape {kernel}")
    if len(specs) == 3 and specs[2].shape not in ((m,), (-1,)):
        raise invalid("ConvTranspose", f"B has shape {specs[2].shape} (expected ({m},))")
    strides = _per_dim(attrs, "strides", nd, 1, 1)
    dilations = _per_dim(attrs, "dilations", nd, 1, 1)
    out_pad = _per_dim(attrs, "output_padding", nd, 0, 0)
    if any(op >= max(s, d) for op, s, d in zip(out_pad, strides, dilations)):
        raise invalid("ConvTranspose", f"output_padding={out_pad} (expected each below its stride or dilation)")
    auto_pad = attr_str("ConvTranspose", attrs, "auto_pad", "NOTSET", AUTO_PADS)
    pads = _per_dim(attrs, "pads", 2 * nd, 0, 0) if auto_pad == "NOTSET" else [0] * (2 * nd)
    full = [s * (n - 1) + op + (k - 1) * d + 1 if n >= 0 else -1
            for n, s, op, k, d in zip(spatial, strides, out_pad, kernel, dilations)]
    target = attr_ints("ConvTranspose", attrs, "output_shape", None)
    if target is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = [n * s if n >= 0 else -1 for n, s in zip(spatial, strides)]
    if target is not None:
        target = target[-nd:] if len(target) in (nd, nd + 2) else None
        if target is None or any(t < 0 for t in target if t != -1):
            raise invalid("ConvTranspose", f"attribute output_shape={attrs.get('output_shape')} (expected {nd} "
                                           f"spatial dims >= 0)")
        begin = []
        for i, (f, t) in enumerate(zip(full, target)):
            total = f - t if known(f, t) else 0
            if total < 0:
                raise invalid("ConvTranspose", f"output_shape={target} is larger than the {full} a transposed "
                                               f"convolution of X {x.shape} can produce")
            begin.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
        out = list(target)
    else:
        begin = pads[:nd]
        out = [f - b - e if f >= 0 else -1 for f, b, e in zip(full, pads[:nd], pads[nd:])]
    if any(o == 0 or o < -1 for o in out):
        raise invalid("ConvTranspose", f"pads {pads} leave no output ({out}) for X {x.shape}")
    return dtype, group, kernel, strides, dilations, begin, full, out


def _infer(specs, attrs):
    dtype, group, _, _, _, _, _, out = _geometry(specs, attrs)
    return [TensorSpec((specs[0].shape[0], specs[1].shape[1] * group) + tuple(out), dtype)]


def _compute(inputs, outputs, attrs):
    """Y = the transposed convolution of X by W (+ B): every input element scatters W's kernel, scaled,
    onto the output at ``stride`` steps; then the pads are cropped (see the module doc)."""
    _, group, kernel, strides, dilations, begin, full, out = _geometry(
        [TensorSpec(a.shape, a.dtype) for a in inputs], attrs)
    x, w = wide(inputs[0]), wide(inputs[1])
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    cg, mg, k, p = c // group, w.shape[1], math.prod(kernel), math.prod(spatial)
    rows = np.moveaxis(x, 1, -1).reshape(n * p, c)  # (N·P, C), channels last
    y = np.zeros((n, group * mg) + tuple(full), x.dtype)
    for g in range(group):
        cols = rows[:, g * cg:(g + 1) * cg] @ w[g * cg:(g + 1) * cg].reshape(cg, mg * k)
        cols = np.moveaxis(cols.reshape((n,) + spatial + (mg, k)), -2, 1)  # (N, Mg, *in, k)
        for i, pos in enumerate(itertools.product(*(range(kk) for kk in kernel))):
            index = tuple(slice(q * d, q * d + (dim - 1) * s + 1, s)
                          for q, d, dim, s in zip(pos, dilations, spatial, strides))
            y[(slice(None), slice(g * mg, (g + 1) * mg)) + index] += cols[..., i]
    y = y[(slice(None), slice(None)) + tuple(slice(b, b + o) for b, o in zip(begin, out))]
    if len(inputs) == 3:
        y = y + wide(inputs[2]).reshape((1, -1) + (1,) * len(spatial))
    outputs[0][...] = y


define("ConvTranspose", "conv_transpose", _infer, _compute, attrs=ATTRS, min_inputs=2, max_inputs=3)
