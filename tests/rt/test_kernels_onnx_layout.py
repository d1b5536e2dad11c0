"""Layout, index and resize kernels (Flatten, Squeeze, Pad, Shape, Range, ArgMax, Resize...) against a
numpy / Python reference and (when installed) onnxruntime running a one-node ONNX model, ONNX's constant
inputs (pads, axes, scales...) being attributes here and initializers there; and the registration of every
kernel an ONNX model needs. Pure numpy: no Ray, no card."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from rt.kernels import registry

sys.path.insert(0, str(Path(__file__).resolve().parent))
from onnx_oracle import BOOL, F16, F32, F64, I64, INVALID, UNSUPPORTED, Const, close, fails, ort, run, spec_of


@pytest.fixture
def rng():
    return np.random.default_rng(2024)


# ---------------------------------------------------------------- layout: Flatten, Squeeze, Unsqueeze, Expand, Tile, Pad

@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(rng, axis):
    x = rng.standard_normal((2, 3, 4)).astype(F32)
    a = axis + 3 if axis < 0 else axis
    got = run("Flatten", x, axis=axis)
    close(got, x.reshape(math.prod(x.shape[:a]), -1))
    close(got, ort("Flatten", [x], {"axis": axis}))
    assert spec_of("Flatten", [((-1, 3, 4), F32)])[0].shape == (-1, 12)
    with fails(INVALID, "Flatten", "axis 4", "rank 3"):
        spec_of("Flatten", [((2, 3, 4), F32)], axis=4)


def test_squeeze_unsqueeze(rng):
    x = rng.standard_normal((1, 3, 1, 4)).astype(F32)
    close(run("Squeeze", x), x.reshape(3, 4))
    close(run("Squeeze", x, axes=[-2]), x.reshape(1, 3, 4))
    close(run("Squeeze", x, axes=[0, 2]), ort("Squeeze", [x, Const(np.array([0, 2]))], opset=13))
    y = run("Unsqueeze", x.reshape(3, 4), axes=[0, -1])
    assert y.shape == (1, 3, 4, 1)
    close(y, ort("Unsqueeze", [x.reshape(3, 4), Const(np.array([0, -1]))], opset=13))
    assert spec_of("Unsqueeze", [((-1, 4), F32)], axes=[1])[0].shape == (-1, 1, 4)
    assert spec_of("Squeeze", [((-1, 1, 4), F32)], axes=[1])[0].shape == (-1, 4)
    with fails(INVALID, "Squeeze", "axis 1", "size 3"):
        spec_of("Squeeze", [((1, 3), F32)], axes=[1])
    with fails(INVALID, "Squeeze", "dynamic shape", "give axes"):
        spec_of("Squeeze", [((-1, 3), F32)])
    with fails(INVALID, "Unsqueeze", "repeats an axis"):
        spec_of("Unsqueeze", [((3,), F32)], axes=[0, 0])
    with fails(INVALID, "Unsqueeze", "axes 3 is out of range for rank 3"):
        spec_of("Unsqueeze", [((3, 4), F32)], axes=[3])
    with fails(INVALID, "Unsqueeze", "attribute 'axes' is required"):
        spec_of("Unsqueeze", [((3,), F32)])


def test_expand_and_tile(rng):
    x = rng.standard_normal((3, 1)).astype(F32)
    for shape in ([2, 3, 4], [3, 1], [1, 5], [1]):
        got = run("Expand", x, shape=shape)
        close(got, x * np.ones(shape))
        close(got, ort("Expand", [x, Const(np.array(shape, np.int64))], opset=13))
    with fails(INVALID, "Expand", "do not broadcast"):
        spec_of("Expand", [((3, 2), F32)], shape=[4, 2])
    b = rng.random((2, 3)) < 0.5
    got = run("Tile", b, repeats=[2, 3])
    close(got, np.tile(b, (2, 3)))
    close(got, ort("Tile", [b, Const(np.array([2, 3], np.int64))], out_dtypes=(BOOL,), opset=13))
    with fails(INVALID, "Tile", "repeats [2]", "expected 2 values"):
        spec_of("Tile", [((2, 3), F32)], repeats=[2])


PAD_CASES = [
    {"pads": [1, 2, 0, 3], "mode": "constant", "constant_value": 1.5},
    {"pads": [0, 2, 1, 1], "mode": "reflect"},
    {"pads": [2, 0, 1, 3], "mode": "edge"},
    {"pads": [1, 1, 1, 2], "mode": "wrap"},
    {"pads": [-1, 1, 0, -2], "mode": "constant"},
    {"pads": [1, 2], "axes": [-1], "mode": "edge"},
]


@pytest.mark.parametrize("attrs", PAD_CASES)
def test_pad(rng, attrs):
    x = rng.standard_normal((3, 5)).astype(F32)
    got = run("Pad", x, **attrs)
    widths = [(0, 0), (0, 0)]
    axes = attrs.get("axes", [0, 1])
    pads = attrs["pads"]
    for i, a in enumerate(axes):
        widths[a] = (pads[i], pads[len(axes) + i])
    crop = x[max(-widths[0][0], 0):x.shape[0] - max(-widths[0][1], 0), max(-widths[1][0], 0):x.shape[1] - max(-widths[1][1], 0)]
    grow = [(max(b, 0), max(e, 0)) for b, e in widths]
    kw = {"constant_values": attrs.get("constant_value", 0.0)} if attrs["mode"] == "constant" else {}
    close(got, np.pad(crop, grow, mode=attrs["mode"], **kw))
    onnx_inputs = [x, Const(np.array(pads, np.int64)), Const(np.float32(attrs.get("constant_value", 0.0)))]
    if "axes" in attrs:
        onnx_inputs.append(Const(np.array(attrs["axes"], np.int64)))
    close(got, ort("Pad", onnx_inputs, {"mode": attrs["mode"]}, opset=19))


def test_pad_errors_and_int():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    close(run("Pad", x, pads=[0, 1, 0, 1], constant_value=-7), np.pad(x, [(0, 0), (1, 1)], constant_values=-7))
    with fails(INVALID, "Pad", "pads [1, 1]", "expected 4"):
        spec_of("Pad", [((2, 3), F32)], pads=[1, 1])
    with fails(INVALID, "Pad", "reflect", "axis 0 of size 2"):
        spec_of("Pad", [((2, 3), F32)], pads=[2, 0, 0, 0], mode="reflect")
    with fails(INVALID, "Pad", "mode='mirror'"):
        spec_of("Pad", [((2, 3), F32)], pads=[1, 0, 0, 0], mode="mirror")
    with fails(INVALID, "Pad", "remove more than the 2 elements of axis 0"):
        spec_of("Pad", [((2, 3), F32)], pads=[-2, 0, -1, 0])
    with fails(INVALID, "Pad", "constant_value=0.5", "int32"):
        spec_of("Pad", [((2, 3), np.int32)], pads=[1, 0, 0, 0], constant_value=0.5)


# ---------------------------------------------------------------- Shape, ConstantOfShape, Range, ArgMax/ArgMin

def test_shape(rng):
    x = rng.standard_normal((2, 3, 4)).astype(F16)
    for attrs in ({}, {"start": 1}, {"end": -1}, {"start": -2, "end": 10}, {"start": 3}):
        got = run("Shape", x, **attrs)
        assert got.dtype == I64
        close(got, np.array(x.shape[attrs.get("start", 0):attrs.get("end", 3)], I64))
        close(got, ort("Shape", [x], attrs, out_dtypes=(I64,), opset=15))
    assert spec_of("Shape", [((-1, 3), F32)])[0].shape == (2,)


def test_constant_of_shape():
    got = run("ConstantOfShape", input=[2, 3])
    assert got.dtype == F32 and got.shape == (2, 3) and not got.any()
    got = run("ConstantOfShape", input=[4], value=[7])
    assert got.dtype == I64
    close(got, np.full(4, 7, I64))
    close(run("ConstantOfShape", shape=[2], value=1.5, dtype="float16"), np.full(2, 1.5, F16))
    close(run("ConstantOfShape", input=[0, 3], value=True), np.ones((0, 3), BOOL))
    with fails(INVALID, "ConstantOfShape", "input [2, -1]", "negative"):
        spec_of("ConstantOfShape", [], input=[2, -1])
    with fails(INVALID, "ConstantOfShape", "value=[1, 2]"):
        spec_of("ConstantOfShape", [], input=[2], value=[1, 2])
    with fails(UNSUPPORTED, "ConstantOfShape", "dtype='complex7'"):
        spec_of("ConstantOfShape", [], input=[2], dtype="complex7")
    with fails(INVALID, "ConstantOfShape", "value=2.5", "int64"):
        spec_of("ConstantOfShape", [], input=[2], value=2.5, dtype="int64")


def test_constant_of_shape_matches_onnxruntime():
    helper = pytest.importorskip("onnx.helper")  # ONNX: the shape is an input, the value a tensor attribute
    want = ort("ConstantOfShape", [Const(np.array([2, 2], np.int64))],
               {"value": helper.make_tensor("v", 6, [1], [3])}, out_dtypes=(np.int32,))  # 6: INT32
    close(run("ConstantOfShape", input=[2, 2], value=3, dtype="int32"), want)


@pytest.mark.parametrize("start, limit, delta, dtype", [(0, 10, 3, I64), (10, 2, -2, I64), (5, 5, 1, I64),
                                                        (0.5, 2.0, 0.25, F32), (1.0, -1.0, -0.3, F32),
                                                        (2, 9, 2, np.dtype(np.int32))])
def test_range(start, limit, delta, dtype):
    got = run("Range", start=start, limit=limit, delta=delta, dtype=str(dtype))
    assert got.dtype == dtype
    close(got, np.arange(start, limit, delta).astype(dtype), 1e-6)
    consts = [Const(np.array(v, dtype)) for v in (start, limit, delta)]
    close(got, ort("Range", consts, out_dtypes=(dtype,), opset=11), 1e-6)
    assert run("Range", start=0, limit=3, delta=1).dtype == I64
    assert run("Range", start=0, limit=3.0, delta=1).dtype == F32
    with fails(INVALID, "Range", "delta=0"):
        spec_of("Range", [], start=0, limit=3, delta=0)
    with fails(INVALID, "Range", "attribute 'limit' is required"):
        spec_of("Range", [], start=0, delta=1)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_max_min(rng, op):
    x = rng.integers(0, 4, (3, 4, 5)).astype(F32)  # many ties: first vs last index matters
    fn = np.argmax if op == "ArgMax" else np.argmin
    for axis, keep, last in itertools.product((0, -1, 1), (0, 1), (0, 1)):
        attrs = {"axis": axis, "keepdims": keep, "select_last_index": last}
        got = run(op, x, **attrs)
        if last:
            want = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis, keepdims=bool(keep))
        else:
            want = fn(x, axis=axis, keepdims=bool(keep))
        close(got, want)
        close(got, ort(op, [x], attrs, out_dtypes=(I64,), opset=13))
    with fails(INVALID, op, "axis 3", "rank 3"):
        spec_of(op, [((3, 4, 5), F32)], axis=3)
    with fails(INVALID, op, "is empty"):
        spec_of(op, [((3, 0), F32)], axis=1)


# ---------------------------------------------------------------- Resize

def resize_reference(x, out_hw, scales, mode, coord, nearest_mode):
    """2-D Resize of (N, C, H, W), one output pixel at a time from the ONNX operator formulas."""
    def source(o, n_in, n_out, scale):
        if coord == "align_corners":
            return o * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        if coord == "asymmetric":
            return o / scale
        if coord == "pytorch_half_pixel":
            return (o + 0.5) / scale - 0.5 if n_out > 1 else 0.0
        if coord == "tf_half_pixel_for_nn":
            return (o + 0.5) / scale
        return (o + 0.5) / scale - 0.5

    def nearest(v, n_in):
        if nearest_mode == "round_prefer_floor":
            i = math.floor(v) if v - math.floor(v) == 0.5 else round(v)
        elif nearest_mode == "round_prefer_ceil":
            i = math.ceil(v) if v - math.floor(v) == 0.5 else round(v)
        else:
            i = math.floor(v) if nearest_mode == "floor" else math.ceil(v)
        return min(max(int(i), 0), n_in - 1)

    h, w = x.shape[2:]
    y = np.zeros(x.shape[:2] + tuple(out_hw))
    for oy, ox in itertools.product(range(out_hw[0]), range(out_hw[1])):
        sy, sx = source(oy, h, out_hw[0], scales[0]), source(ox, w, out_hw[1], scales[1])
        if mode == "nearest":
            y[:, :, oy, ox] = x[:, :, nearest(sy, h), nearest(sx, w)]
            continue
        sy, sx = min(max(sy, 0.0), h - 1), min(max(sx, 0.0), w - 1)
        y0, x0 = math.floor(sy), math.floor(sx)
        y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
        fy, fx = sy - y0, sx - x0
        y[:, :, oy, ox] = ((1 - fy) * ((1 - fx) * x[:, :, y0, x0] + fx * x[:, :, y0, x1])
                           + fy * ((1 - fx) * x[:, :, y1, x0] + fx * x[:, :, y1, x1]))
    return y


COORDS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]
RESIZE_TARGETS = [("scales", [2.0, 2.0]), ("scales", [0.5, 0.75]), ("scales", [1.7, 1.0]), ("sizes", [7, 3]),
                  ("sizes", [1, 10])]


@pytest.mark.parametrize("target", RESIZE_TARGETS, ids=str)
@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("mode, nearest_mode", [("linear", "round_prefer_floor"), ("nearest", "round_prefer_floor"),
                                                ("nearest", "round_prefer_ceil"), ("nearest", "floor"),
                                                ("nearest", "ceil")])
def test_resize(rng, target, coord, mode, nearest_mode):
    x = rng.standard_normal((1, 2, 4, 5)).astype(F32)
    kind, values = target
    attrs = {"mode": mode, "coordinate_transformation_mode": coord, "nearest_mode": nearest_mode}
    got = run("Resize", x, **{kind: values}, axes=[2, 3], **attrs)
    if kind == "scales":
        out_hw = [math.floor(n * s) for n, s in zip(x.shape[2:], values)]
        scales = values
    else:
        out_hw, scales = values, [o / n for o, n in zip(values, x.shape[2:])]
    close(got, resize_reference(x.astype(F64), out_hw, scales, mode, coord, nearest_mode), 1e-5)
    full = [1.0, 1.0] + values if kind == "scales" else list(x.shape[:2]) + values
    consts = [None, Const(np.array(full, F32))] if kind == "scales" else [None, None, Const(np.array(full, I64))]
    close(got, ort("Resize", [x] + consts, attrs, opset=13), 1e-5)


def test_resize_more(rng):
    x = rng.standard_normal((2, 3, 4, 6)).astype(F32)
    # torch's F.interpolate(scale_factor=2, mode='nearest') exports as asymmetric + floor on all 4 dims
    up = run("Resize", x, scales=[1.0, 1.0, 2.0, 2.0], mode="nearest", coordinate_transformation_mode="asymmetric",
             nearest_mode="floor")
    close(up, x.repeat(2, axis=2).repeat(2, axis=3))
    half = run("Resize", x.astype(F16), sizes=[2, 3, 8, 12], mode="linear")
    assert half.dtype == F16 and half.shape == (2, 3, 8, 12)
    close(half, run("Resize", x, sizes=[2, 3, 8, 12], mode="linear"), 2e-2)
    i8 = rng.integers(-9, 9, (1, 1, 3, 3)).astype(np.int8)
    close(run("Resize", i8, scales=[1, 1, 2, 2], mode="nearest"), resize_reference(
        i8.astype(F64), [6, 6], [2, 2], "nearest", "half_pixel", "round_prefer_floor").astype(np.int8))
    for policy in ("not_larger", "not_smaller"):
        attrs = {"mode": "linear", "keep_aspect_ratio_policy": policy}
        got = run("Resize", x, sizes=[6, 6], axes=[2, 3], **attrs)
        assert got.shape == ((2, 3, 4, 6) if policy == "not_larger" else (2, 3, 6, 9))
        close(got, ort("Resize", [x, None, None, Const(np.array([6, 6], I64))], dict(attrs, axes=[2, 3]),
                       opset=18), 1e-5)
    assert spec_of("Resize", [((-1, 3, 10, 10), F32)], scales=[1, 1, 2, 2])[0].shape == (-1, 3, 20, 20)
    assert spec_of("Resize", [((-1, 3, -1, -1), F32)], sizes=[1, 3, 5, 5])[0].shape == (1, 3, 5, 5)


def test_resize_errors():
    x = [((1, 3, 4, 4), F32)]
    with fails(INVALID, "Resize", "exactly one of the attributes 'scales' and 'sizes'"):
        spec_of("Resize", x)
    with fails(INVALID, "Resize", "exactly one"):
        spec_of("Resize", x, scales=[1, 1, 2, 2], sizes=[1, 3, 8, 8])
    with fails(INVALID, "Resize", "scales [2.0, 2.0] has 2 values", "4 resized axes"):
        spec_of("Resize", x, scales=[2.0, 2.0])
    with fails(INVALID, "Resize", "mode='cubic' is not supported"):
        spec_of("Resize", x, scales=[1, 1, 2, 2], mode="cubic")
    with fails(INVALID, "Resize", "tf_crop_and_resize"):
        spec_of("Resize", x, scales=[1, 1, 2, 2], coordinate_transformation_mode="tf_crop_and_resize")
    with fails(INVALID, "Resize", "mode='bilinear'"):
        spec_of("Resize", x, scales=[1, 1, 2, 2], mode="bilinear")
    with fails(INVALID, "Resize", "scales [1.0, 1.0, 0.0, 2.0]", "> 0"):
        spec_of("Resize", x, scales=[1, 1, 0, 2])
    with fails(INVALID, "Resize", "antialias=1"):
        spec_of("Resize", x, scales=[1, 1, 2, 2], antialias=1)
    with fails(UNSUPPORTED, "Resize", "int8"):
        spec_of("Resize", [((1, 3, 4, 4), np.int8)], scales=[1, 1, 2, 2], mode="linear")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_is_asymmetric_resize(rng, mode):
    x = rng.standard_normal((1, 2, 3, 4)).astype(F32)
    got = run("Upsample", x, scales=[1, 1, 2, 1.5], mode=mode)
    assert got.shape == (1, 2, 6, 6)
    close(got, resize_reference(x.astype(F64), [6, 6], [2, 1.5], mode, "asymmetric", "floor"))
    close(got, ort("Upsample", [x, Const(np.array([1, 1, 2, 1.5], F32))], {"mode": mode}, opset=9))
    with fails(INVALID, "Upsample", "scales [1.0, 1.0, 0.5, 1.0]", ">= 1"):
        spec_of("Upsample", [((1, 2, 3, 4), F32)], scales=[1, 1, 0.5, 1])


# ---------------------------------------------------------------- registration

NEW_OPS = ["Conv", "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Clip",
           "Erf", "HardSigmoid", "HardSwish", "LeakyRelu", "PRelu", "Abs", "Reciprocal", "Floor", "Ceil", "Dropout",
           "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "Min", "Max",
           "Sum", "Mean", "Mod", "Flatten", "Squeeze", "Unsqueeze", "Expand", "Tile", "Pad", "Shape",
           "ConstantOfShape", "Range", "ArgMax", "ArgMin", "Resize", "Upsample", "Softplus", "Softsign", "Mish",
           "Elu", "Selu", "Sign", "Sin", "Cos", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare",
           "ReduceLogSum", "ReduceLogSumExp", "TopK", "GatherElements", "InstanceNormalization", "ConvTranspose",
           "Trilu", "CumSum"]


def test_new_ops_registered_with_docs_and_usable_eager_names():
    import builtins
    import keyword
    for name in NEW_OPS:
        op = registry.get_op(name)
        assert op.name == name and op.doc, name
        assert op.snake.isidentifier() and not keyword.iskeyword(op.snake), op.snake
        assert not hasattr(builtins, op.snake), op.snake  # rt.ops.<snake> must not shadow a builtin
        assert registry.get_op(op.snake) is op


@pytest.mark.parametrize("dtype", [F32, I64])
def test_topk(rng, dtype):
    x = rng.integers(-5, 5, (3, 6)).astype(dtype)  # ties: equal values keep the lower index first
    for axis, k, largest in ((1, 3, 1), (0, 2, 0), (-1, 6, 0), (1, 0, 1)):
        values, indices = run("TopK", x, K=k, axis=axis, largest=largest)
        order = np.argsort(-x.astype(F64) if largest else x, axis=axis, kind="stable")
        want = np.take(order, np.arange(k), axis=axis)
        close(indices, want)
        close(values, np.take_along_axis(x, want, axis=axis))
        got_v, got_i = ort("TopK", [x, Const(np.array([k], np.int64))], {"axis": axis, "largest": largest},
                           out_dtypes=(dtype, I64), opset=11)
        close(values, got_v)
        close(indices, got_i)
    with fails(INVALID, "TopK", "K=7", "size 6"):
        spec_of("TopK", [((3, 6), F32)], K=7)
    with fails(INVALID, "TopK", "attribute 'K' is required"):
        spec_of("TopK", [((3, 6), F32)])


def test_gather_elements(rng):
    data = rng.standard_normal((3, 4)).astype(F32)
    idx = np.array([[0, -1, 2, 1], [2, 0, -3, 0]], np.int64)
    for axis in (0, -2):
        got = run("GatherElements", data, idx, axis=axis)
        close(got, np.take_along_axis(data, np.where(idx < 0, idx + 3, idx), axis=0))
        close(got, ort("GatherElements", [data, idx], {"axis": axis}, opset=13))
    idx1 = np.array([[3], [0], [-4]], np.int64)
    close(run("GatherElements", data, idx1, axis=1), ort("GatherElements", [data, idx1], {"axis": 1}, opset=13))
    with fails(INVALID, "GatherElements", "index 4", "size 4"):
        run("GatherElements", data, np.array([[4]], np.int64), axis=1)
    with fails(INVALID, "GatherElements", "same rank"):
        spec_of("GatherElements", [((3, 4), F32), ((3,), I64)])


def test_trilu_and_cumsum(rng):
    x = rng.standard_normal((2, 4, 5)).astype(F32)
    for upper, k in ((1, 0), (0, 0), (1, 2), (0, -1), (1, -7)):
        got = run("Trilu", x, upper=upper, k=k)
        close(got, (np.triu if upper else np.tril)(x, k))
        close(got, ort("Trilu", [x, Const(np.array(k, np.int64))], {"upper": upper}, opset=14))
    with fails(INVALID, "Trilu", "rank >= 2"):
        spec_of("Trilu", [((4,), F32)])
    a = rng.integers(-5, 5, (3, 4)).astype(np.int32)
    for axis, exclusive, reverse in ((0, 0, 0), (1, 1, 0), (-1, 0, 1), (0, 1, 1)):
        got = run("CumSum", a, axis=axis, exclusive=exclusive, reverse=reverse)
        flipped = np.flip(a, axis) if reverse else a
        want = np.cumsum(flipped, axis=axis) - (flipped if exclusive else 0)
        close(got, np.flip(want, axis) if reverse else want)
        close(got, ort("CumSum", [a, Const(np.array(axis, np.int64))], {"exclusive": exclusive, "reverse": reverse},
                       out_dtypes=(np.int32,), opset=14))
    with fails(INVALID, "CumSum", "attribute 'axis' is required"):
        spec_of("CumSum", [((3,), F32)])
