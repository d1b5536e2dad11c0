"""Built-in kernels (forward ops) against plain numpy / Python oracles: results, dtypes, shape
inference with dynamic dims, and every error path. Pure numpy: no Ray, no card."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from rt.dtypes import BFLOAT16
from rt.kernels import registry
from rt.kernels.registry import TensorSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from onnx_oracle import fails  # the helper next to this file

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
FLOATS = [F16, BFLOAT16, F32, F64]
INTS = [np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8)]
BOOL = np.dtype(np.bool_)
ALL = FLOATS + INTS + [BOOL]
TOL = {F16: 1e-2, BFLOAT16: 2e-2, F32: 1e-5, F64: 1e-12}
INVALID, OUTPUT_MISMATCH, INPUT_MISMATCH, NOT_FOUND, UNSUPPORTED = 100000, 100022, 100021, 100024, 100026


def run(op, *inputs, **attrs):
    """infer + compute of one op on numpy arrays; one array or a list for several outputs."""
    specs = registry.infer(op, [TensorSpec(a.shape, a.dtype) for a in inputs], attrs)
    outs = [np.full(s.shape, 77, s.dtype) for s in specs]  # non-zero: a kernel must write every element
    registry.get_op(op).compute(list(inputs), outs, attrs)
    return outs[0] if len(outs) == 1 else outs


def spec_of(op, shapes_dtypes, **attrs):
    return registry.infer(op, [TensorSpec(s, d) for s, d in shapes_dtypes], attrs)


def rand(rng, shape, dtype, low=-2.0, high=2.0):
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else int(low) - 3
        return rng.integers(lo, int(high) + 4, size=shape).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)


def close(got, want, dtype):
    dtype = np.dtype(dtype)
    assert got.dtype == dtype
    if dtype.kind in "iub":
        np.testing.assert_array_equal(got, np.asarray(want).astype(dtype))
    else:
        tol = TOL[dtype]
        np.testing.assert_allclose(got.astype(F64), want, rtol=tol, atol=tol)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def f64(a):
    return np.asarray(a).astype(F64)


# ---------------------------------------------------------------- elementwise binary

BINARY = {"Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
          "Div": lambda a, b: a / b, "Pow": lambda a, b: a ** b}
BROADCASTS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (2, 3)), ((1,), (5, 1, 2))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
def test_add_sub_mul(rng, op, dtype):
    for sa, sb in BROADCASTS:
        a, b = rand(rng, sa, dtype), rand(rng, sb, dtype)
        if dtype.kind in "iu":  # exact in int64, then wrapped to the dtype like the hardware
            want = BINARY[op](a.astype(np.int64), b.astype(np.int64))
        else:
            want = BINARY[op](f64(a), f64(b))
        got = run(op, a, b)
        assert got.shape == np.broadcast_shapes(sa, sb)
        close(got, want, dtype)


@pytest.mark.parametrize("op", ["Div", "Pow"])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_div_pow(rng, op, dtype):
    for sa, sb in BROADCASTS:
        a, b = rand(rng, sa, dtype, 0.5, 2.0), rand(rng, sb, dtype, 0.5, 2.0)
        close(run(op, a, b), BINARY[op](f64(a), f64(b)), dtype)


def test_int_overflow_wraps():
    a = np.array([127, -128], np.int8)
    np.testing.assert_array_equal(run("Add", a, np.array([1, -1], np.int8)), np.array([-128, 127], np.int8))


@pytest.mark.parametrize("op", ["Div", "Pow"])
def test_div_pow_reject_ints(op):
    with fails(UNSUPPORTED, op, "int32", "expected one of"):
        spec_of(op, [((2,), np.int32), ((2,), np.int32)])


def test_binary_errors():
    with fails(UNSUPPORTED, "Add", "float32", "float16"):
        spec_of("Add", [((2,), F32), ((2,), F16)])
    with fails(UNSUPPORTED, "Add", "bool"):
        spec_of("Add", [((2,), BOOL), ((2,), BOOL)])
    with fails(INVALID, "Add", "(3, 4)", "(5,)", "broadcast"):
        spec_of("Add", [((3, 4), F32), ((5,), F32)])


def test_broadcast_with_dynamic_dims():
    assert spec_of("Add", [((-1, 4), F32), ((4,), F32)])[0].shape == (-1, 4)
    assert spec_of("Mul", [((-1, 1), F32), ((1, 5), F32)])[0].shape == (-1, 5)
    assert spec_of("Sub", [((-1, 3), F32), ((7, 1), F32)])[0].shape == (7, 3)
    assert spec_of("Add", [((-1,), F32), ((-1,), F32)])[0].shape == (-1,)
    with fails(INVALID, "broadcast"):  # the known dims contradict each other, the -1 does not help
        spec_of("Add", [((-1, 3), F32), ((2, 4), F32)])


# ---------------------------------------------------------------- elementwise unary

def _gelu(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.ravel()]).reshape(x.shape)


UNARY = {
    "Neg": (lambda x: -x, -2, 2), "Exp": (np.exp, -3, 3), "Log": (np.log, 0.1, 5), "Sqrt": (np.sqrt, 0, 9),
    "Relu": (lambda x: np.where(x > 0, x, 0), -2, 2), "Tanh": (np.tanh, -3, 3),
    "Sigmoid": (lambda x: 1 / (1 + np.exp(-x)), -8, 8), "Identity": (lambda x: x, -2, 2),
}


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_unary_float(rng, op, dtype):
    fn, low, high = UNARY[op]
    x = rand(rng, (3, 5), dtype, low, high)
    close(run(op, x), fn(f64(x)), dtype)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_gelu(rng, approximate, dtype):
    x = rand(rng, (4, 6), dtype, -4, 4)
    close(run("Gelu", x, approximate=approximate), _gelu(f64(x), approximate), dtype)


def test_gelu_default_is_exact_and_modes_differ(rng):
    x = rand(rng, (50,), F64, -3, 3)
    np.testing.assert_allclose(run("Gelu", x), _gelu(x, "none"), rtol=1e-14, atol=1e-15)
    assert np.abs(run("Gelu", x, approximate="tanh") - run("Gelu", x)).max() > 1e-5
    with fails(INVALID, "Gelu", "approximate", "'erf'", "'none', 'tanh'"):
        spec_of("Gelu", [((2,), F32)], approximate="erf")


def test_sigmoid_extremes_do_not_overflow():
    x = np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0], np.float32)
    got = run("Sigmoid", x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, [0.0, 1.9287498e-22, 0.5, 1.0, 1.0], rtol=1e-6)


def test_neg_ints_and_identity_all(rng):
    for dtype in [d for d in INTS if d.kind == "i"]:
        x = rand(rng, (7,), dtype)
        close(run("Neg", x), -x.astype(np.int64), dtype)
    with fails(UNSUPPORTED, "Neg", "uint8"):
        spec_of("Neg", [((2,), np.uint8)])
    for dtype in ALL:
        x = rand(rng, (2, 3), dtype)
        close(run("Identity", x), x, dtype)


@pytest.mark.parametrize("op", ["Exp", "Log", "Sqrt", "Relu", "Sigmoid", "Tanh", "Gelu"])
def test_float_math_rejects_ints(op):
    with fails(UNSUPPORTED, op, "int64"):
        spec_of(op, [((2,), np.int64)])


# ---------------------------------------------------------------- Where / Cast

@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_where(rng, dtype):
    cond = rng.random((3, 1)) < 0.5
    x, y = rand(rng, (1, 4), dtype), rand(rng, (3, 4), dtype)
    xf, yf = f64(x), f64(y)
    want = [[xf[0, j] if cond[i, 0] else yf[i, j] for j in range(4)] for i in range(3)]
    close(run("Where", cond, x, y), np.array(want), dtype)


def test_where_errors():
    with fails(UNSUPPORTED, "Where", "condition", "float32", "bool"):
        spec_of("Where", [((2,), F32), ((2,), F32), ((2,), F32)])
    with fails(UNSUPPORTED, "Where", "int32", "int64"):
        spec_of("Where", [((2,), BOOL), ((2,), np.int32), ((2,), np.int64)])
    with fails(INVALID, "Where", "broadcast"):
        spec_of("Where", [((3,), BOOL), ((2,), F32), ((2,), F32)])


@pytest.mark.parametrize("src", ALL, ids=str)
def test_cast_every_pair(src):
    values = np.array([0, 1, 2, 5, 1, 0], np.int64).reshape(2, 3)  # exact in every dtype
    x = values.astype(src)
    for dst in ALL:
        got = run("Cast", x, to=str(dst))
        assert got.dtype == dst
        want = (values != 0) if BOOL in (src, dst) else values
        np.testing.assert_array_equal(got.astype(F64), want.astype(F64), err_msg=f"{src} -> {dst}")


def test_cast_to_spellings_and_errors():
    x = np.array([1.7, -2.5], np.float32)
    assert run("Cast", x, to=0).dtype == F32           # ACL_FLOAT
    assert run("Cast", x, to=27).dtype == BFLOAT16     # ACL_BF16
    assert run("Cast", x, to="fp16").dtype == F16
    np.testing.assert_array_equal(run("Cast", x, to=3), [1, -2])  # ACL_INT32 truncates toward 0
    with fails(INVALID, "Cast", "'to'", "required"):
        spec_of("Cast", [((2,), F32)])
    with fails(UNSUPPORTED, "Cast", "999"):
        spec_of("Cast", [((2,), F32)], to=999)
    with fails(UNSUPPORTED, "Cast", "complex64"):
        spec_of("Cast", [((2,), F32)], to="complex64")
    with fails(UNSUPPORTED, "Cast", "uint16"):
        spec_of("Cast", [((2,), np.uint16)], to="float32")


# ---------------------------------------------------------------- MatMul / Gemm

MATMUL_SHAPES = [((3, 4), (4, 5)), ((2, 3, 4), (4, 2)), ((2, 1, 3, 4), (5, 4, 2)), ((4,), (4, 3)),
                 ((2, 3, 4), (4,)), ((4,), (4,))]


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
def test_matmul(rng, dtype):
    for sa, sb in MATMUL_SHAPES:
        a, b = rand(rng, sa, dtype, -2, 2), rand(rng, sb, dtype, -2, 2)
        a2 = f64(a)[None, :] if a.ndim == 1 else f64(a)
        b2 = f64(b)[:, None] if b.ndim == 1 else f64(b)
        batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        a3 = np.broadcast_to(a2, batch + a2.shape[-2:]).reshape(-1, *a2.shape[-2:])
        b3 = np.broadcast_to(b2, batch + b2.shape[-2:]).reshape(-1, *b2.shape[-2:])
        want = np.array([[[sum(x[i, k] * y[k, j] for k in range(x.shape[1])) for j in range(y.shape[1])]
                          for i in range(x.shape[0])] for x, y in zip(a3, b3)])
        want = want.reshape(batch + (a2.shape[-2], b2.shape[-1]))
        want = want.reshape(np.matmul(np.zeros(sa), np.zeros(sb)).shape)  # drop the 1-D helper dims
        if dtype.kind in "iu":
            want = want.astype(np.int64)
        close(run("MatMul", a, b), want, dtype)


def test_matmul_infer_and_errors():
    with fails(INVALID, "MatMul: inner dimensions differ: A is (4, 3), B is (5, 2) "
                        "(expected A.shape[-1] == B.shape[-2])"):
        spec_of("MatMul", [((4, 3), F32), ((5, 2), F32)])
    with fails(INVALID, "MatMul", "rank >= 1"):
        spec_of("MatMul", [((), F32), ((3,), F32)])
    with fails(UNSUPPORTED, "MatMul", "float32", "float64"):
        spec_of("MatMul", [((2, 2), F32), ((2, 2), F64)])
    with fails(UNSUPPORTED, "MatMul", "bool"):
        spec_of("MatMul", [((2, 2), BOOL), ((2, 2), BOOL)])
    with fails(INVALID, "MatMul", "batch"):
        spec_of("MatMul", [((2, 3, 4), F32), ((3, 4, 5), F32)])
    assert spec_of("MatMul", [((-1, 3), F32), ((3, 4), F32)])[0].shape == (-1, 4)
    assert spec_of("MatMul", [((2, -1), F32), ((5, 4), F32)])[0].shape == (2, 4)
    assert spec_of("MatMul", [((-1, 2, 3), F32), ((4, 3, -1), F32)])[0].shape == (4, 2, -1)
    assert spec_of("MatMul", [((-1,), F32), ((-1,), F32)])[0].shape == ()


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm(rng, dtype, trans_a, trans_b):
    m, k, n = 3, 4, 5
    a = rand(rng, (k, m) if trans_a else (m, k), dtype)
    b = rand(rng, (n, k) if trans_b else (k, n), dtype)
    op_a = f64(a).T if trans_a else f64(a)
    op_b = f64(b).T if trans_b else f64(b)
    close(run("Gemm", a, b, transA=trans_a, transB=trans_b), op_a @ op_b, dtype)
    for c_shape in [(), (n,), (m, 1), (1, n), (m, n)]:
        c = rand(rng, c_shape, dtype)
        got = run("Gemm", a, b, c, transA=trans_a, transB=trans_b, alpha=0.5, beta=-2.0)
        close(got, 0.5 * (op_a @ op_b) - 2.0 * f64(c), dtype)


def test_gemm_errors():
    with fails(INVALID, "Gemm", "C", "(3,)", "(2, 4)"):
        spec_of("Gemm", [((2, 5), F32), ((5, 4), F32), ((3,), F32)])
    with fails(INVALID, "Gemm", "C", "(2, 4, 1)"):
        spec_of("Gemm", [((2, 5), F32), ((5, 4), F32), ((2, 4, 1), F32)])
    with fails(INVALID, "Gemm", "A", "2-D"):
        spec_of("Gemm", [((5,), F32), ((5, 4), F32)])
    with fails(INVALID, "Gemm", "inner dimensions differ", "transA=1"):
        spec_of("Gemm", [((2, 5), F32), ((5, 4), F32)], transA=1)
    with fails(INVALID, "Gemm", "alpha"):
        spec_of("Gemm", [((2, 5), F32), ((5, 4), F32)], alpha="big")
    with fails(UNSUPPORTED, "Gemm", "int32"):
        spec_of("Gemm", [((2, 5), np.int32), ((5, 4), np.int32)])
    assert spec_of("Gemm", [((-1, 5), F32), ((5, -1), F32), ((1, 4), F32)])[0].shape == (-1, -1)


# ---------------------------------------------------------------- Softmax / LogSoftmax / LayerNormalization

def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_log_softmax(rng, dtype, axis):
    x = rand(rng, (2, 3, 4), dtype, -5, 5)
    close(run("Softmax", x, axis=axis), _softmax(f64(x), axis), dtype)
    close(run("LogSoftmax", x, axis=axis), np.log(_softmax(f64(x), axis)), dtype)


def test_softmax_default_axis_large_values_and_errors():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, 0.0, 1000.0]], np.float32)
    p = np.exp(np.array([-2.0, -1.0, 0.0]))
    np.testing.assert_allclose(run("Softmax", x)[0], p / p.sum(), rtol=1e-6)
    np.testing.assert_allclose(run("LogSoftmax", x)[1], [-2000.0, -1000.0, 0.0], rtol=1e-6)
    with fails(INVALID, "Softmax", "axis 2", "rank 2"):
        spec_of("Softmax", [((2, 3), F32)], axis=2)


def _layer_norm(x, scale, bias, axis, eps=1e-5):
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)
    return (x - mean) * inv * scale + (0 if bias is None else bias), mean, inv


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("axis,scale_shape,with_bias", [(-1, (4,), True), (1, (3, 4), True), (1, (4,), False),
                                                        (0, (2, 3, 4), True), (-2, (1, 4), True)])
def test_layer_normalization(rng, dtype, axis, scale_shape, with_bias):
    x = rand(rng, (2, 3, 4), dtype, -3, 3)
    scale = rand(rng, scale_shape, dtype, 0.5, 1.5)
    bias = rand(rng, scale_shape, dtype) if with_bias else None
    inputs = (x, scale) + ((bias,) if with_bias else ())
    y, mean, inv = run("LayerNormalization", *inputs, axis=axis, epsilon=1e-3)
    want_y, want_mean, want_inv = _layer_norm(f64(x), f64(scale), None if bias is None else f64(bias), axis, 1e-3)
    close(y, want_y, dtype)
    stat_dtype = F64 if dtype == F64 else F32
    stat_shape = x.shape[:axis % 3] + (1,) * (3 - axis % 3)
    assert mean.shape == inv.shape == stat_shape
    assert mean.dtype == inv.dtype == stat_dtype
    np.testing.assert_allclose(mean, want_mean, rtol=TOL[dtype], atol=TOL[dtype])
    np.testing.assert_allclose(inv, want_inv, rtol=TOL[dtype])


def test_layer_normalization_errors_and_dynamic():
    with fails(INVALID, "LayerNormalization", "Scale", "(3,)", "(4,)"):
        spec_of("LayerNormalization", [((2, 4), F32), ((3,), F32)])
    with fails(INVALID, "LayerNormalization", "B", "(5,)"):
        spec_of("LayerNormalization", [((2, 4), F32), ((4,), F32), ((5,), F32)])
    with fails(UNSUPPORTED, "LayerNormalization", "X is float32 but Scale is float16"):
        spec_of("LayerNormalization", [((2, 4), F32), ((4,), F16)])
    with fails(INVALID, "LayerNormalization", "stash_type"):
        spec_of("LayerNormalization", [((2, 4), F32), ((4,), F32)], stash_type=0)
    with fails(INVALID, "LayerNormalization", "epsilon"):
        spec_of("LayerNormalization", [((2, 4), F32), ((4,), F32)], epsilon=-1.0)
    y, mean, inv = spec_of("LayerNormalization", [((-1, 3, 4), F16), ((3, 4), F16)], axis=1)
    assert (y.shape, y.dtype, mean.shape, mean.dtype, inv.shape) == ((-1, 3, 4), F16, (-1, 1, 1), F32, (-1, 1, 1))


# ---------------------------------------------------------------- Reshape / Transpose / Concat / Split

@pytest.mark.parametrize("shape,want", [([4, -1], (4, 6)), ([0, -1], (2, 12)), ([0, 0, -1], (2, 3, 4)),
                                        ([-1], (24,)), ([2, 0, 2, 2], (2, 3, 2, 2)), ([24, 1], (24, 1))])
def test_reshape(rng, shape, want):
    for dtype in (F32, np.dtype(np.int8), BOOL, BFLOAT16):
        x = rand(rng, (2, 3, 4), dtype)
        got = run("Reshape", x, shape=shape)
        assert got.shape == want
        close(got, f64(x).ravel().reshape(want), dtype)


def test_reshape_allowzero_and_errors():
    x = np.zeros((0, 3), np.float32)
    assert run("Reshape", x, shape=[3, 0], allowzero=1).shape == (3, 0)
    assert run("Reshape", x, shape=[0, 3]).shape == (0, 3)
    s = [((2, 3, 4), F32)]
    with fails(INVALID, "Reshape", "more than one -1"):
        spec_of("Reshape", s, shape=[-1, -1])
    with fails(INVALID, "Reshape", "(2, 3, 4)", "24 elements", "[5, 5]", "25 elements"):
        spec_of("Reshape", s, shape=[5, 5])
    with fails(INVALID, "Reshape", "not a multiple of 5"):
        spec_of("Reshape", s, shape=[5, -1])
    with fails(INVALID, "Reshape", "copies dim 3"):
        spec_of("Reshape", s, shape=[2, 12, 1, 0])
    with fails(INVALID, "Reshape", "negative dim"):
        spec_of("Reshape", s, shape=[-2, 12])
    with fails(INVALID, "Reshape", "allowzero=1"):
        spec_of("Reshape", [((0, 3), F32)], shape=[0, -1], allowzero=1)
    with fails(INVALID, "Reshape", "'shape'", "required"):
        spec_of("Reshape", s)
    with fails(INVALID, "Reshape", "list of ints"):
        spec_of("Reshape", s, shape=[2.0, 12])


def test_reshape_dynamic():
    dyn = [((-1, 3, 4), F32)]
    assert spec_of("Reshape", dyn, shape=[0, 12])[0].shape == (-1, 12)
    assert spec_of("Reshape", dyn, shape=[-1, 4])[0].shape == (-1, 4)
    assert spec_of("Reshape", dyn, shape=[6, -1])[0].shape == (6, -1)
    assert spec_of("Reshape", [((2, -1), F32)], shape=[0, 0])[0].shape == (2, -1)


def test_transpose(rng):
    for dtype in ALL:
        x = rand(rng, (2, 3, 4), dtype)
        got = run("Transpose", x, perm=[1, 2, 0])
        assert got.shape == (3, 4, 2)
        xf = f64(x)
        want = [[[xf[k, i, j] for k in range(2)] for j in range(4)] for i in range(3)]
        close(got, np.array(want), dtype)
        close(run("Transpose", x), f64(x).T, dtype)
    with fails(INVALID, "Transpose", "perm [0, 0, 1]", "permutation"):
        spec_of("Transpose", [((2, 3, 4), F32)], perm=[0, 0, 1])
    with fails(INVALID, "Transpose", "perm [1, 0]"):
        spec_of("Transpose", [((2, 3, 4), F32)], perm=[1, 0])
    assert spec_of("Transpose", [((-1, 3), F32)], perm=[1, 0])[0].shape == (3, -1)


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_concat(rng, dtype):
    parts = [rand(rng, (2, n, 3), dtype) for n in (1, 4, 2)]
    got = run("Concat", *parts, axis=1)
    want = np.array([[row for p in parts for row in f64(p[b]).tolist()] for b in range(2)])
    close(got, want, dtype)
    close(run("Concat", *parts[:1], axis=-1), f64(parts[0]), dtype)


def test_concat_errors_and_dynamic():
    with fails(INVALID, "Concat", "'axis'", "required"):
        spec_of("Concat", [((2, 3), F32), ((2, 3), F32)])
    with fails(INVALID, "Concat", "inputs[1]", "(3, 3)", "axis 1"):
        spec_of("Concat", [((2, 3), F32), ((3, 3), F32)], axis=1)
    with fails(INVALID, "Concat", "rank 1"):
        spec_of("Concat", [((2, 3), F32), ((3,), F32)], axis=0)
    with fails(UNSUPPORTED, "Concat", "inputs[0] is float32 but inputs[2] is int32"):
        spec_of("Concat", [((2,), F32), ((2,), F32), ((2,), np.int32)], axis=0)
    with fails(INVALID, "Concat", "axis 2", "rank 2"):
        spec_of("Concat", [((2, 3), F32)], axis=2)
    assert spec_of("Concat", [((-1, 3), F32), ((2, -1), F32)], axis=0)[0].shape == (-1, 3)
    assert spec_of("Concat", [((4, 3), F32), ((2, 3), F32)], axis=0)[0].shape == (6, 3)


@pytest.mark.parametrize("attrs,sizes", [({"split": [1, 4, 2]}, [1, 4, 2]), ({"num_outputs": 7}, [1] * 7),
                                         ({"num_outputs": 3}, [3, 3, 1]), ({"num_outputs": 2}, [4, 3]),
                                         ({"split": [0, 7]}, [0, 7])])
def test_split(rng, attrs, sizes):
    for dtype in (F16, np.dtype(np.int64), BOOL):
        x = rand(rng, (2, 7), dtype)
        outs = run("Split", x, axis=-1, **attrs)
        outs = outs if isinstance(outs, list) else [outs]
        assert [o.shape[1] for o in outs] == sizes
        start = 0
        for o, size in zip(outs, sizes):
            close(o, f64(x)[:, start:start + size], dtype)
            start += size


def test_split_errors_and_dynamic():
    s = [((6, 2), F32)]
    with fails(INVALID, "Split", "exactly one"):
        spec_of("Split", s)
    with fails(INVALID, "Split", "exactly one"):
        spec_of("Split", s, split=[3, 3], num_outputs=2)
    with fails(INVALID, "Split", "sums to 5", "size 6"):
        spec_of("Split", s, split=[2, 3])
    with fails(INVALID, "Split", "num_outputs=4", "size 6"):
        spec_of("Split", s, num_outputs=4)
    with fails(INVALID, "Split", "num_outputs=0"):
        spec_of("Split", s, num_outputs=0)
    assert [o.shape for o in spec_of("Split", [((-1, 2), F32)], num_outputs=2)] == [(-1, 2), (-1, 2)]
    assert [o.shape for o in spec_of("Split", [((-1, 2), F32)], split=[1, 2])] == [(1, 2), (2, 2)]


# ---------------------------------------------------------------- Slice / Gather

BIG = 2 ** 63 - 1


def test_slice_onnx_examples():
    data = np.arange(1, 9, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(run("Slice", data, starts=[1, 0], ends=[2, 3], axes=[0, 1], steps=[1, 2]),
                                  [[5, 7]])
    np.testing.assert_array_equal(run("Slice", data, starts=[0, 1], ends=[-1, 1000]), [[2, 3, 4]])
    np.testing.assert_array_equal(run("Slice", data, starts=[-1], ends=[-BIG - 1], axes=[1], steps=[-1]),
                                  [[4, 3, 2, 1], [8, 7, 6, 5]])
    np.testing.assert_array_equal(run("Slice", data, starts=[5], ends=[BIG], axes=[1]).shape, (2, 0))
    # ONNX clamps a too-negative start to 0 for negative steps: element 0 is in the slice
    np.testing.assert_array_equal(run("Slice", data, starts=[-9], ends=[-BIG - 1], axes=[1], steps=[-1]),
                                  [[1], [5]])


def test_slice_matches_python_slicing(rng):
    # Python's slice clamping is ONNX's (negative bounds count from the end, then clamp to the axis)
    # except one case: a start still < 0 with a negative step. ONNX clamps it to 0 (the slice holds
    # element 0), Python makes the slice empty. The oracle spells that case out.
    x = rand(rng, (5, 6, 3), np.int32)
    bounds = [-BIG - 1, -9, -6, -3, -1, 0, 1, 2, 4, 5, 6, 9, BIG]
    for _ in range(300):
        axes = sorted(rng.choice([0, 1, 2, -1], size=2, replace=False).tolist(), key=lambda a: a % 3)
        if axes[0] % 3 == axes[1] % 3:
            continue
        starts, ends = [int(rng.choice(bounds)) for _ in axes], [int(rng.choice(bounds)) for _ in axes]
        steps = [int(rng.choice([-3, -2, -1, 1, 2, 3])) for _ in axes]
        index = [slice(None)] * 3
        for a, s, e, st in zip(axes, starts, ends, steps):
            if st < 0 and s < -x.shape[a]:
                s = 0
            index[a % 3] = slice(s, e, st)
        got = run("Slice", x, starts=starts, ends=ends, axes=axes, steps=steps)
        np.testing.assert_array_equal(got, x[tuple(index)], err_msg=str((starts, ends, axes, steps)))


def test_slice_errors_and_dynamic():
    s = [((4, 5), F32)]
    with fails(INVALID, "Slice", "steps [0]", "non-zero"):
        spec_of("Slice", s, starts=[0], ends=[2], steps=[0])
    with fails(INVALID, "Slice", "equal length"):
        spec_of("Slice", s, starts=[0, 1], ends=[2])
    with fails(INVALID, "Slice", "axes", "2", "rank 2"):
        spec_of("Slice", s, starts=[0], ends=[2], axes=[2])
    with fails(INVALID, "Slice", "repeats"):
        spec_of("Slice", s, starts=[0, 0], ends=[2, 2], axes=[1, -1])
    assert spec_of("Slice", [((-1, 5), F32)], starts=[1, 1], ends=[3, 3])[0].shape == (-1, 2)


@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather(rng, idx_dtype, axis):
    for dtype in (F32, BFLOAT16, np.dtype(np.uint8), BOOL):
        data = rand(rng, (3, 4, 5), dtype)
        dim = data.shape[axis]
        indices = rng.integers(-dim, dim, size=(2, 3)).astype(idx_dtype)
        got = run("Gather", data, indices, axis=axis)
        index = [slice(None)] * 3
        index[axis] = indices % dim  # one advanced index: its dims land where the axis was
        close(got, f64(data)[tuple(index)], dtype)
    scalar = run("Gather", np.arange(6.0).reshape(2, 3), np.array(-1, np.int64), axis=1)
    np.testing.assert_array_equal(scalar, [2.0, 5.0])


def test_gather_errors():
    with fails(INVALID, "Gather", "index 4", "position (1, 0)", "size 4", "-4 <= index < 4"):
        run("Gather", np.zeros((4, 2), np.float32), np.array([[0, 1], [4, -4]], np.int64))
    with fails(INVALID, "Gather", "index -5"):
        run("Gather", np.zeros((4, 2), np.float32), np.array([-5], np.int32))
    with fails(UNSUPPORTED, "Gather", "indices", "float32"):
        spec_of("Gather", [((4, 2), F32), ((3,), F32)])
    with fails(INVALID, "Gather", "scalar"):
        spec_of("Gather", [((), F32), ((3,), np.int64)])
    assert spec_of("Gather", [((-1, 7), F32), ((2, -1), np.int64)], axis=0)[0].shape == (2, -1, 7)


# ---------------------------------------------------------------- reductions

REDUCE = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max}


@pytest.mark.parametrize("op,dtype", [(op, d) for op in sorted(REDUCE) for d in FLOATS + INTS
                                      if op != "ReduceMean" or d.kind == "f"], ids=str)
def test_reductions(rng, op, dtype):
    x = rand(rng, (2, 3, 4), dtype)
    wide = x.astype(np.int64) if dtype.kind in "iu" else f64(x)
    for axes, keepdims in [(None, 1), (None, 0), ([1], 1), ([0, -1], 0), ([2, 0, 1], 1), ([], 0)]:
        attrs = {"keepdims": keepdims} if axes is None else {"axes": axes, "keepdims": keepdims}
        want = REDUCE[op](wide, axis=None if not axes else tuple(axes), keepdims=bool(keepdims))
        got = run(op, x, **attrs)
        assert got.shape == np.shape(want)
        close(got, want, dtype)
    close(run(op, x, axes=[], noop_with_empty_axes=1), wide, dtype)


def test_reduce_empty_sets():
    assert run("ReduceMax", np.zeros((0, 3), np.float32), axes=[0]).tolist() == [[-np.inf] * 3]
    assert run("ReduceMax", np.zeros((0,), np.int16), keepdims=0) == np.iinfo(np.int16).min
    assert run("ReduceSum", np.zeros((0, 2), np.int32), axes=[0], keepdims=0).tolist() == [0, 0]
    assert np.isnan(run("ReduceMean", np.zeros((0,), np.float32)))


def test_reduce_errors_and_dynamic():
    with fails(UNSUPPORTED, "ReduceMean", "int32"):
        spec_of("ReduceMean", [((2,), np.int32)])
    with fails(UNSUPPORTED, "ReduceSum", "bool"):
        spec_of("ReduceSum", [((2,), BOOL)])
    with fails(INVALID, "ReduceSum", "axes 3", "rank 2"):
        spec_of("ReduceSum", [((2, 3), F32)], axes=[3])
    with fails(INVALID, "ReduceMax", "repeats"):
        spec_of("ReduceMax", [((2, 3), F32)], axes=[1, -1])
    assert spec_of("ReduceSum", [((-1, 3, -1), F32)], axes=[1])[0].shape == (-1, 1, -1)
    assert spec_of("ReduceMean", [((-1, 3), F32)], axes=[0], keepdims=0)[0].shape == (3,)


# ---------------------------------------------------------------- the registry and shared checks

REQUIRED = ["MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Neg", "Exp", "Log", "Sqrt", "Pow", "Relu", "Gelu",
            "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "LayerNormalization", "Reshape", "Transpose", "Concat",
            "Split", "Slice", "Gather", "ReduceSum", "ReduceMean", "ReduceMax", "Cast", "Where", "Identity",
            "ReluGrad", "GeluGrad", "SoftmaxGrad", "LayerNormalizationGrad", "SoftmaxCrossEntropyLoss",
            "SoftmaxCrossEntropyLossGrad", "SGDMomentum", "Adam"]


def test_every_op_registered_with_doc():
    for name in REQUIRED:
        op = registry.get_op(name)
        assert registry.get_op(op.snake) is op
        assert op.doc and op.snake == op.snake.lower()
    assert registry.get_op("matmul").name == "MatMul"
    assert registry.get_op("layer_normalization").name == "LayerNormalization"
    with fails(NOT_FOUND, "'NoSuchOp'"):
        registry.get_op("NoSuchOp")


def test_unknown_attribute_and_input_count():
    with fails(INVALID, "Softmax", "unknown attribute(s) axsi", "expected: axis"):
        spec_of("Softmax", [((2, 3), F32)], axsi=0)
    with fails(INVALID, "Relu", "unknown attribute(s) alpha", "expected: none"):
        run("Relu", np.zeros(2, np.float32), alpha=0.1)
    with fails(INPUT_MISMATCH, "Add", "got 1 inputs"):
        spec_of("Add", [((2,), F32)])
    with fails(INPUT_MISMATCH, "MatMul", "got 3 inputs"):
        registry.get_op("MatMul").compute([np.zeros((2, 2))] * 3, [np.zeros((2, 2))], {})


def test_compute_rejects_mismatched_output_buffers():
    a = np.ones((2, 3), np.float32)
    with fails(INVALID, "Add", "output 0 is (3, 2) float32, expected (2, 3) float32"):
        registry.get_op("Add").compute([a, a], [np.zeros((3, 2), np.float32)], {})
    with fails(INVALID, "Add", "float64"):
        registry.get_op("Add").compute([a, a], [np.zeros((2, 3), np.float64)], {})
    with fails(OUTPUT_MISMATCH, "Split", "got 1 outputs, expected 2"):
        registry.get_op("Split").compute([a], [np.zeros((1, 3), np.float32)], {"num_outputs": 2})


def test_inputs_are_not_modified(rng):
    x = rand(rng, (3, 4), F32)
    keep = x.copy()
    run("Softmax", x)
    run("LayerNormalization", x, np.ones(4, np.float32))
    run("Relu", x)
    np.testing.assert_array_equal(x, keep)


# ---------------------------------------------------------------- rt.ops (eager wrappers) over a fake card

class FakeTensor:
    """Just what rt.ops touches of rt.Tensor: shape, dtype, ptr; the data lives in a numpy array."""

    def __init__(self, array):
        self.array, self.shape, self.dtype, self.ptr = array, array.shape, array.dtype, id(array)


@pytest.fixture
def fake_card(monkeypatch):
    import msgpack


    launches = []

    def launch_kernel(op, inputs, outputs, attrs=None, stream=None):
        msgpack.packb(attrs)  # attrs must survive the command channel
        launches.append((op, stream))
        registry.get_op(op).compute([t.array for t in inputs], [t.array for t in outputs], attrs)

    import rt.host.ops as host_ops  # what rt.ops calls to allocate outputs and launch
    monkeypatch.setattr(host_ops, "empty", lambda shape, dtype: FakeTensor(np.zeros(shape, dtype)))
    monkeypatch.setattr(host_ops, "launch_kernel", launch_kernel)
    return launches


def test_ops_functions_generated_from_registry():
    from rt import ops

    for name in REQUIRED:
        fn = getattr(ops, registry.get_op(name).snake)
        assert fn.__name__ == registry.get_op(name).snake and name in fn.__doc__
    assert set(ops.__all__) == set(registry.BY_SNAKE)
    assert "in place" in ops.adam.__doc__


def test_ops_single_multi_and_inplace_results(fake_card, rng):
    from rt import ops

    a, b = rand(rng, (2, 3), F32), rand(rng, (3, 4), F32)
    y = ops.matmul(FakeTensor(a), FakeTensor(b), stream="s1")
    np.testing.assert_allclose(y.array, f64(a) @ f64(b), rtol=1e-5)
    assert fake_card[-1] == ("MatMul", "s1")
    parts = ops.split(FakeTensor(a), axis=np.int64(1), split=np.array([1, 2]))  # numpy attrs are converted
    assert isinstance(parts, tuple) and [p.shape for p in parts] == [(2, 1), (2, 2)]
    assert ops.cast(FakeTensor(a), to=np.float16).dtype == F16
    assert ops.cast(FakeTensor(a), to=BFLOAT16).dtype == BFLOAT16
    param, grad, vel = FakeTensor(np.ones(3)), FakeTensor(np.ones(3)), FakeTensor(np.zeros(3))
    assert ops.sgd_momentum(param, grad, vel, lr=0.5) is None
    np.testing.assert_allclose(param.array, [0.5] * 3)


def test_ops_check_before_launch_and_out(fake_card, rng):
    from rt import ops

    a = FakeTensor(rand(rng, (2, 3), F32))
    with fails(INVALID, "inner dimensions differ"):
        ops.matmul(a, a)
    assert fake_card == []  # nothing was launched
    out = FakeTensor(np.zeros((2, 3), np.float32))
    assert ops.relu(a, out=[out]) is out
    np.testing.assert_array_equal(out.array, np.maximum(a.array, 0))
    with fails(INVALID, "relu: out[0] is (3, 2) float32, expected (2, 3) float32"):
        ops.relu(a, out=[FakeTensor(np.zeros((3, 2), np.float32))])
    with fails(OUTPUT_MISMATCH, "out= has 2 tensors, expected 1"):
        ops.relu(a, out=[out, out])
