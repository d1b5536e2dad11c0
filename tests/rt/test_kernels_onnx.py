"""The convolution-network kernels (Conv, BatchNormalization, pooling) against two independent oracles:
a plain numpy / Python reference written here, and (when installed) onnxruntime running a one-node ONNX
model of the same op. Pure numpy: no Ray, no card."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from rt.dtypes import BFLOAT16

sys.path.insert(0, str(Path(__file__).resolve().parent))
from onnx_oracle import F16, F32, F64, INPUT_MISMATCH, INVALID, UNSUPPORTED, Const, close, fails, ort, run, spec_of


@pytest.fixture
def rng():
    return np.random.default_rng(2024)


# ---------------------------------------------------------------- Conv

def conv_reference(x, w, b, strides, dilations, pads, group):
    """Direct definition: one dot product per output element (tiny shapes only)."""
    n, _c = x.shape[:2]
    m, cg, *kernel = w.shape
    nd = len(kernel)
    xp = np.pad(x.astype(F64), [(0, 0), (0, 0)] + [(pads[i], pads[nd + i]) for i in range(nd)])
    out = [(xp.shape[2 + i] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(nd)]
    y = np.zeros([n, m] + out)
    for b_, oc in itertools.product(range(n), range(m)):
        g = oc // (m // group)
        for pos in itertools.product(*map(range, out)):
            idx = tuple(slice(p * s, p * s + (k - 1) * d + 1, d)
                        for p, s, k, d in zip(pos, strides, kernel, dilations))
            patch = xp[(b_, slice(g * cg, (g + 1) * cg)) + idx]
            y[(b_, oc) + pos] = np.sum(patch * w[oc].astype(F64)) + (b[oc] if b is not None else 0.0)
    return y


CONV_CASES = [  # x shape, w shape, attrs (explicit pads always given for the reference)
    ((2, 3, 7, 8), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 9, 9), (6, 2, 3, 3), {"group": 2, "pads": [1, 0, 2, 1], "strides": [2, 1], "dilations": [1, 2]}),
    ((1, 6, 7, 7), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1], "strides": [2, 2]}),   # depthwise
    ((1, 4, 5, 5), (8, 1, 3, 3), {"group": 4, "pads": [0, 0, 0, 0]}),                   # depth multiplier 2
    ((2, 5, 6, 6), (7, 5, 1, 1), {}),                                             # pointwise
    ((2, 5, 6, 6), (7, 5, 1, 1), {"strides": [2, 2]}),                               # downsample 1x1
    ((2, 3, 11), (4, 3, 3), {"pads": [2, 1], "strides": [2], "dilations": [2]}),           # 1-D
    ((1, 2, 4, 5, 5), (3, 2, 2, 3, 3), {"pads": [0, 1, 1, 1, 0, 1], "strides": [1, 2, 1]}),  # 3-D
    # 16+ channels per group: the channels-last im2col, rows-first and (few positions) weights-first
    ((2, 16, 8, 8), (8, 16, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((1, 32, 5, 5), (64, 16, 3, 3), {"group": 2, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((2, 16, 6, 6), (4, 16, 1, 1), {}),
    ((2, 16, 6, 6), (4, 16, 1, 1), {"strides": [2, 2], "pads": [1, 0, 0, 1]}),
    ((1, 16, 3, 4, 4), (4, 16, 2, 2, 2), {"pads": [1, 0, 0, 0, 1, 1], "strides": [1, 1, 2]}),
]


@pytest.mark.parametrize("xs, ws, attrs", CONV_CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_conv_matches_reference_and_onnxruntime(rng, xs, ws, attrs, bias):
    x = rng.standard_normal(xs).astype(F32)
    w = rng.standard_normal(ws).astype(F32)
    b = rng.standard_normal(ws[0]).astype(F32) if bias else None
    nd = len(xs) - 2
    got = run("Conv", *([x, w] + ([b] if bias else [])), **attrs)
    want = conv_reference(x, w, b, attrs.get("strides", [1] * nd), attrs.get("dilations", [1] * nd),
                          attrs.get("pads", [0] * 2 * nd), attrs.get("group", 1))
    close(got, want, 1e-4)
    close(got, ort("Conv", [x, w] + ([b] if bias else []), attrs), 1e-4)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("size, stride", [(9, 2), (10, 2), (8, 3)])
def test_conv_auto_pad(rng, auto_pad, size, stride):
    x = rng.standard_normal((1, 2, size, size + 1)).astype(F32)
    w = rng.standard_normal((3, 2, 3, 2)).astype(F32)
    attrs = {"auto_pad": auto_pad, "strides": [stride, stride]}
    got = run("Conv", x, w, **attrs)
    if auto_pad != "VALID":
        assert got.shape[2:] == (-(-size // stride), -(-(size + 1) // stride))
    close(got, ort("Conv", [x, w], attrs), 1e-4)


@pytest.mark.parametrize("dtype", [F16, BFLOAT16, F64], ids=str)
def test_conv_other_float_dtypes(rng, dtype):
    x = rng.standard_normal((2, 4, 6, 6)).astype(dtype)
    w = (rng.standard_normal((4, 2, 3, 3)) * 0.3).astype(dtype)
    got = run("Conv", x, w, group=2, pads=[1, 1, 1, 1])
    assert got.dtype == dtype
    want = conv_reference(x.astype(F64), w.astype(F64), None, [1, 1], [1, 1], [1, 1, 1, 1], 2)
    close(got, want, {F16: 2e-2, BFLOAT16: 6e-2, F64: 1e-10}[dtype])


def test_conv_dynamic_batch_shape():
    (y,) = spec_of("Conv", [((-1, 3, 224, 224), F32), ((64, 3, 7, 7), F32), ((64,), F32)],
                   pads=[3, 3, 3, 3], strides=[2, 2])
    assert y.shape == (-1, 64, 112, 112) and y.dtype == F32


def test_conv_errors():
    with fails(INVALID, "Conv", "X has 4 channels", "group=1", "expects 3"):
        spec_of("Conv", [((1, 4, 8, 8), F32), ((2, 3, 3, 3), F32)])
    with fails(INVALID, "Conv", "W has shape (2, 3, 3)", "rank 4"):
        spec_of("Conv", [((1, 3, 8, 8), F32), ((2, 3, 3), F32)])
    with fails(INVALID, "Conv", "group=4", "dividing the 6 output channels"):
        spec_of("Conv", [((1, 4, 8, 8), F32), ((6, 1, 3, 3), F32)], group=4)
    with fails(INVALID, "Conv", "kernel_shape=[5, 5]", "[3, 3]"):
        spec_of("Conv", [((1, 3, 8, 8), F32), ((2, 3, 3, 3), F32)], kernel_shape=[5, 5])
    with fails(INVALID, "Conv", "pads=[1, 1]", "expected 4 values"):
        spec_of("Conv", [((1, 3, 8, 8), F32), ((2, 3, 3, 3), F32)], pads=[1, 1])
    with fails(INVALID, "Conv", "strides=[0, 1]"):
        spec_of("Conv", [((1, 3, 8, 8), F32), ((2, 3, 3, 3), F32)], strides=[0, 1])
    with fails(INVALID, "Conv", "B has shape (3,)", "(2,)"):
        spec_of("Conv", [((1, 3, 8, 8), F32), ((2, 3, 3, 3), F32), ((3,), F32)])
    with fails(INVALID, "Conv", "auto_pad='SAME'"):
        spec_of("Conv", [((1, 3, 8, 8), F32), ((2, 3, 3, 3), F32)], auto_pad="SAME")
    with fails(INVALID, "Conv", "spatial dim 0 of size 2", "kernel extent 3"):
        spec_of("Conv", [((1, 3, 2, 8), F32), ((2, 3, 3, 3), F32)])
    with fails(INVALID, "Conv", "rank >= 3"):
        spec_of("Conv", [((3, 8), F32), ((2, 3), F32)])
    with fails(UNSUPPORTED, "Conv", "float32", "float16"):
        spec_of("Conv", [((1, 3, 8, 8), F32), ((2, 3, 3, 3), F16)])
    with fails(UNSUPPORTED, "Conv", "int32"):
        spec_of("Conv", [((1, 3, 8, 8), np.int32), ((2, 3, 3, 3), np.int32)])
    with fails(INPUT_MISMATCH, "Conv", "got 1 inputs"):
        spec_of("Conv", [((1, 3, 8, 8), F32)])


# ---------------------------------------------------------------- BatchNormalization

@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 3, 4, 5)])
def test_batch_normalization(rng, shape):
    c = shape[1]
    x = rng.standard_normal(shape).astype(F32)
    scale, bias, mean = (rng.standard_normal(c).astype(F32) for _ in range(3))
    var = rng.uniform(0.5, 2.0, c).astype(F32)
    got = run("BatchNormalization", x, scale, bias, mean, var, epsilon=1e-3)
    bshape = (1, c) + (1,) * (len(shape) - 2)
    want = ((x.astype(F64) - mean.reshape(bshape)) / np.sqrt(var.reshape(bshape).astype(F64) + 1e-3)
            * scale.reshape(bshape) + bias.reshape(bshape))
    close(got, want, 1e-5)
    close(got, ort("BatchNormalization", [x, Const(scale), Const(bias), Const(mean), Const(var)],
                   {"epsilon": 1e-3}, opset=15), 1e-5)
    half = run("BatchNormalization", x.astype(F16), *(a.astype(F16) for a in (scale, bias, mean, var)), epsilon=1e-3)
    assert half.dtype == F16
    close(half, want, 3e-2)


def test_batch_normalization_errors():
    ok = [((2, 3, 4, 4), F32)] + [((3,), F32)] * 4
    with fails(INVALID, "BatchNormalization", "input_var has shape (4,)", "3 channels"):
        spec_of("BatchNormalization", ok[:4] + [((4,), F32)])
    with fails(INVALID, "BatchNormalization", "training_mode=1"):
        spec_of("BatchNormalization", ok, training_mode=1)
    with fails(INVALID, "BatchNormalization", "rank >= 2"):
        spec_of("BatchNormalization", [((3,), F32)] + ok[1:])
    with fails(INPUT_MISMATCH, "BatchNormalization", "got 3 inputs"):
        spec_of("BatchNormalization", ok[:3])


# ---------------------------------------------------------------- pooling

def pool_reference(x, kind, kernel, strides, pads, ceil_mode=False, count_include_pad=False, dilations=None):
    """Window by window over explicit coordinates, as the ONNX operator text describes it."""
    nd = len(kernel)
    dilations = dilations or [1] * nd
    spatial = x.shape[2:]
    out = []
    for i in range(nd):
        span = (kernel[i] - 1) * dilations[i] + 1
        room = spatial[i] + pads[i] + pads[nd + i] - span
        o = (math.ceil(room / strides[i]) if ceil_mode else room // strides[i]) + 1
        if ceil_mode and (o - 1) * strides[i] >= spatial[i] + pads[i]:
            o -= 1
        out.append(o)
    y = np.zeros(x.shape[:2] + tuple(out))
    for pos in itertools.product(*map(range, out)):
        taps, counted = [], 0
        for off in itertools.product(*map(range, kernel)):
            coord = [p * s - pads[i] + o * d for i, (p, s, o, d) in enumerate(zip(pos, strides, off, dilations))]
            inside = all(0 <= c < n for c, n in zip(coord, spatial))
            in_pads = all(-pads[i] <= c < n + pads[nd + i] for i, (c, n) in enumerate(zip(coord, spatial)))
            if inside:
                taps.append(x[(slice(None), slice(None)) + tuple(coord)].astype(F64))
            counted += inside or (count_include_pad and in_pads)
        if kind == "max":
            y[(slice(None), slice(None)) + pos] = np.max(taps, axis=0)
        else:
            y[(slice(None), slice(None)) + pos] = np.sum(taps, axis=0) / counted
    return y


POOL_CASES = [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},                 # ResNet stem
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 2, 1], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "strides": [3, 3], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [2, 3], "dilations": [2, 1], "pads": [1, 1, 1, 1]},
]


@pytest.mark.parametrize("attrs", POOL_CASES)
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pools_match_reference_and_onnxruntime(rng, op, attrs):
    x = rng.standard_normal((2, 3, 10, 11)).astype(F32)
    variants = [dict(attrs)] if op == "MaxPool" else [dict(attrs, count_include_pad=0),
                                                      dict(attrs, count_include_pad=1)]
    for v in variants:
        got = run(op, x, **v)
        want = pool_reference(x, "max" if op == "MaxPool" else "avg", v["kernel_shape"], v.get("strides", [1, 1]),
                              v.get("pads", [0] * 4), bool(v.get("ceil_mode")), bool(v.get("count_include_pad")),
                              v.get("dilations"))
        close(got, want, 1e-5)
        close(got, ort(op, [x], v, opset=19), 1e-5)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pools_auto_pad(rng, op, auto_pad):
    x = rng.standard_normal((1, 2, 9, 8)).astype(F32)
    attrs = {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": auto_pad}
    close(run(op, x, **attrs), ort(op, [x], attrs, opset=19), 1e-5)


def test_pools_1d_3d_and_half(rng):
    x1 = rng.standard_normal((2, 3, 12)).astype(F32)
    close(run("MaxPool", x1, kernel_shape=[3], strides=[2]), pool_reference(x1, "max", [3], [2], [0, 0]))
    x3 = rng.standard_normal((1, 2, 5, 6, 4)).astype(F32)
    a = {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "pads": [1, 1, 0, 0, 1, 1]}
    close(run("AveragePool", x3, **a), pool_reference(x3, "avg", a["kernel_shape"], a["strides"], a["pads"]))
    h = x1.astype(F16)
    got = run("AveragePool", h, kernel_shape=[4], strides=[4])
    assert got.dtype == F16
    close(got, x1.astype(F16).astype(F64).reshape(2, 3, 3, 4).mean(-1), 1e-2)
    i8 = (rng.integers(-100, 100, (1, 1, 4, 4))).astype(np.int8)
    close(run("MaxPool", i8, kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1]),
          pool_reference(i8, "max", [2, 2], [2, 2], [1, 1, 1, 1]).astype(np.int8))


@pytest.mark.parametrize("op, fn", [("GlobalAveragePool", np.mean), ("GlobalMaxPool", np.max)])
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
def test_global_pools(rng, op, fn, shape):
    x = rng.standard_normal(shape).astype(F32)
    got = run(op, x)
    axes = tuple(range(2, len(shape)))
    close(got, fn(x.astype(F64), axis=axes, keepdims=True))
    close(got, ort(op, [x]))
    assert spec_of(op, [((-1, 3, -1, -1), F32)])[0].shape == (-1, 3, 1, 1)


def test_pool_errors():
    with fails(INVALID, "MaxPool", "attribute 'kernel_shape' is required"):
        spec_of("MaxPool", [((1, 3, 8, 8), F32)])
    with fails(INVALID, "AveragePool", "kernel_shape=[3]", "expected 2 values"):
        spec_of("AveragePool", [((1, 3, 8, 8), F32)], kernel_shape=[3])
    with fails(INVALID, "MaxPool", "pads [3, 0, 0, 0]", "not smaller than the kernel extent 3"):
        spec_of("MaxPool", [((1, 3, 8, 8), F32)], kernel_shape=[3, 3], pads=[3, 0, 0, 0])
    with fails(INVALID, "MaxPool", "storage_order=1"):
        spec_of("MaxPool", [((1, 3, 8, 8), F32)], kernel_shape=[2, 2], storage_order=1)
    with fails(INVALID, "MaxPool", "rank >= 3"):
        spec_of("MaxPool", [((8, 8), F32)], kernel_shape=[2, 2])
    with fails(INVALID, "GlobalAveragePool", "rank >= 3"):
        spec_of("GlobalAveragePool", [((3, 8), F32)])
    with fails(UNSUPPORTED, "AveragePool", "int8"):
        spec_of("AveragePool", [((1, 3, 8, 8), np.int8)], kernel_shape=[2, 2])
    with fails(INVALID, "MaxPool", "unknown attribute(s) count_include_pad"):
        spec_of("MaxPool", [((1, 3, 8, 8), F32)], kernel_shape=[2, 2], count_include_pad=1)


def test_instance_normalization(rng):
    x = rng.standard_normal((2, 3, 4, 5)).astype(F32)
    scale, bias = rng.standard_normal(3).astype(F32), rng.standard_normal(3).astype(F32)
    got = run("InstanceNormalization", x, scale, bias, epsilon=1e-3)
    x64 = x.astype(F64)
    mean, var = x64.mean(axis=(2, 3), keepdims=True), x64.var(axis=(2, 3), keepdims=True)
    close(got, (x64 - mean) / np.sqrt(var + 1e-3) * scale.reshape(1, 3, 1, 1) + bias.reshape(1, 3, 1, 1), 1e-5)
    close(got, ort("InstanceNormalization", [x, Const(scale), Const(bias)], {"epsilon": 1e-3}, opset=6), 1e-4)
    with fails(INVALID, "InstanceNormalization", "B has shape (4,)", "3 channels"):
        spec_of("InstanceNormalization", [((2, 3, 4), F32), ((3,), F32), ((4,), F32)])
    with fails(INVALID, "InstanceNormalization", "rank >= 3"):
        spec_of("InstanceNormalization", [((2, 3), F32), ((3,), F32), ((3,), F32)])


# ---------------------------------------------------------------- ConvTranspose

def conv_transpose_reference(x, w, strides, dilations, pads, out_pad, group):
    """Scatter each input element's scaled kernel onto the output, then crop the pads (tiny shapes)."""
    n, c, *spatial = x.shape
    cg, mg, *kernel = w.shape[0] // group, w.shape[1], *w.shape[2:]
    nd = len(spatial)
    full = [s * (d_in - 1) + op + (k - 1) * d + 1
            for d_in, s, op, k, d in zip(spatial, strides, out_pad, kernel, dilations)]
    y = np.zeros([n, mg * group] + full)
    for b, ci in itertools.product(range(n), range(c)):
        g = ci // cg
        for pos in itertools.product(*map(range, spatial)):
            for off in itertools.product(*map(range, kernel)):
                at = tuple(p * s + o * d for p, s, o, d in zip(pos, strides, off, dilations))
                y[(b, slice(g * mg, (g + 1) * mg)) + at] += x[(b, ci) + pos] * w[(ci, slice(None)) + off]
    return y[(slice(None), slice(None)) + tuple(slice(pads[i], full[i] - pads[nd + i]) for i in range(nd))]


CONVT_CASES = [
    ((1, 4, 3, 3), (4, 2, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ((2, 4, 3, 4), (4, 3, 2, 3), {"group": 2, "strides": [2, 1], "dilations": [1, 2], "pads": [0, 1, 1, 0]}),
    ((1, 3, 5), (3, 2, 4), {"strides": [3]}),
    ((1, 20, 3, 3), (20, 4, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # a UNet/DCGAN 2× upsampling
]


@pytest.mark.parametrize("xs, ws, attrs", CONVT_CASES)
def test_conv_transpose(rng, xs, ws, attrs):
    x = rng.standard_normal(xs).astype(F32)
    w = rng.standard_normal(ws).astype(F32)
    b = rng.standard_normal(ws[1] * attrs.get("group", 1)).astype(F32)
    nd = len(xs) - 2
    got = run("ConvTranspose", x, w, b, **attrs)
    want = conv_transpose_reference(x, w, attrs.get("strides", [1] * nd), attrs.get("dilations", [1] * nd),
                                    attrs.get("pads", [0] * 2 * nd), attrs.get("output_padding", [0] * nd),
                                    attrs.get("group", 1)) + b.reshape((1, -1) + (1,) * nd)
    close(got, want, 1e-4)
    close(got, ort("ConvTranspose", [x, w, b], attrs, opset=17), 1e-4)


@pytest.mark.parametrize("attrs", [{"output_shape": [7, 8], "strides": [2, 2]}, {"output_shape": [6, 7], "strides": [2, 2]},
                                   {"output_shape": [6, 7], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
                                   {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
                                   {"auto_pad": "SAME_LOWER", "strides": [2, 2]}])
def test_conv_transpose_output_shape_and_auto_pad(rng, attrs):
    x = rng.standard_normal((1, 2, 3, 4)).astype(F32)
    w = rng.standard_normal((2, 3, 3, 3)).astype(F32)
    got = run("ConvTranspose", x, w, **attrs)
    if "output_shape" in attrs:
        assert got.shape[2:] == tuple(attrs["output_shape"])
    else:
        assert got.shape[2:] == (6, 8)
    close(got, ort("ConvTranspose", [x, w], attrs, opset=17), 1e-4)


def test_conv_transpose_errors():
    with fails(INVALID, "ConvTranspose", "X has 3 channels", "W.shape[0] == channels"):
        spec_of("ConvTranspose", [((1, 3, 4, 4), F32), ((4, 2, 3, 3), F32)])
    with fails(INVALID, "ConvTranspose", "output_padding=[2, 2]"):
        spec_of("ConvTranspose", [((1, 3, 4, 4), F32), ((3, 2, 3, 3), F32)], strides=[2, 2], output_padding=[2, 2])
    with fails(INVALID, "ConvTranspose", "output_shape=[20, 20] is larger"):
        spec_of("ConvTranspose", [((1, 3, 4, 4), F32), ((3, 2, 3, 3), F32)], output_shape=[20, 20])
    with fails(INVALID, "ConvTranspose", "B has shape (3,)", "(2,)"):
        spec_of("ConvTranspose", [((1, 3, 4, 4), F32), ((3, 2, 3, 3), F32), ((3,), F32)])
    assert spec_of("ConvTranspose", [((-1, 3, 4, 4), F32), ((3, 2, 3, 3), F32)],
                   strides=[2, 2])[0].shape == (-1, 2, 9, 9)
