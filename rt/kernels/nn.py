"""Neural-network ops: MatMul, Gemm, Softmax, LogSoftmax, LayerNormalization (ONNX semantics)."""

from __future__ import annotations

import numpy as np

from .common import (F32, F64, FLOATS, NUMERIC, attr_float, attr_int, broadcast, broadcasts_to, check_dtype,
                     define, invalid, known, norm_axis, same_dtype, wide)
from .opdef import TensorSpec


# ---------------------------------------------------------------- MatMul

def _matmul_infer(specs, attrs):
    a, b = specs
    check_dtype("MatMul", "A", a, NUMERIC)
    dtype = same_dtype("MatMul", [("A", a), ("B", b)])
    if not a.shape or not b.shape:
        raise invalid("MatMul", f"A is {a.shape}, B is {b.shape} (expected both of rank >= 1)")
    # numpy.matmul: a 1-D A is a row vector, a 1-D B a column vector; the added dim is dropped after.
    a2 = a.shape if len(a.shape) >= 2 else (1,) + a.shape
    b2 = b.shape if len(b.shape) >= 2 else b.shape + (1,)
    if known(a2[-1], b2[-2]) and a2[-1] != b2[-2]:
        b_dim = "B.shape[-2]" if len(b.shape) >= 2 else "B.shape[0]"
        raise invalid("MatMul", f"inner dimensions differ: A is {a.shape}, B is {b.shape} "
                                f"(expected A.shape[-1] == {b_dim})")
    batch = broadcast("MatMul", [("A batch dims", a2[:-2]), ("B batch dims", b2[:-2])])
    out = batch + (a2[-2],) * (len(a.shape) >= 2) + (b2[-1],) * (len(b.shape) >= 2)
    return [TensorSpec(out, dtype)]


def _matmul_compute(inputs, outputs, attrs):
    """Y = A @ B with numpy.matmul semantics (batched, broadcast batch dims, 1-D operands)."""
    a, b = inputs
    outputs[0][...] = np.matmul(wide(a), wide(b))


define("MatMul", "matmul", _matmul_infer, _matmul_compute, min_inputs=2)


# ---------------------------------------------------------------- Gemm

def _gemm_infer(specs, attrs):
    a, b = specs[:2]
    check_dtype("Gemm", "A", a, FLOATS)
    named = [("A", a), ("B", b)] + ([("C", specs[2])] if len(specs) == 3 else [])
    dtype = same_dtype("Gemm", named)
    trans_a, trans_b = attr_int("Gemm", attrs, "transA", 0), attr_int("Gemm", attrs, "transB", 0)
    attr_float("Gemm", attrs, "alpha", 1.0)  # type checks only: the values matter at run time
    attr_float("Gemm", attrs, "beta", 1.0)
    for name, spec in (("A", a), ("B", b)):
        if len(spec.shape) != 2:
            raise invalid("Gemm", f"{name} has shape {spec.shape} (expected a 2-D matrix)")
    m, k_a = a.shape[::-1] if trans_a else a.shape
    k_b, n = b.shape[::-1] if trans_b else b.shape
    if known(k_a, k_b) and k_a != k_b:
        raise invalid("Gemm", f"inner dimensions differ: A is {a.shape} (transA={trans_a}), B is {b.shape} "
                              f"(transB={trans_b}); expected op(A).shape[1] == op(B).shape[0]")
    if len(specs) == 3:
        broadcasts_to("Gemm", "C", specs[2].shape, (m, n), "the output")
    return [TensorSpec((m, n), dtype)]


def _gemm_compute(inputs, outputs, attrs):
    """Y = alpha·op(A)·op(B) + beta·C, op(X) = Xᵀ when transX=1; C optional, broadcast to (M, N)."""
    a, b = wide(inputs[0]), wide(inputs[1])
    a = a.T if attr_int("Gemm", attrs, "transA", 0) else a
    b = b.T if attr_int("Gemm", attrs, "transB", 0) else b
    y = attr_float("Gemm", attrs, "alpha", 1.0) * (a @ b)
    if len(inputs) == 3:
        y = y + attr_float("Gemm", attrs, "beta", 1.0) * wide(inputs[2])
    outputs[0][...] = y


define("Gemm", "gemm", _gemm_infer, _gemm_compute, attrs=("transA", "transB", "alpha", "beta"),
       min_inputs=2, max_inputs=3)


# ---------------------------------------------------------------- Softmax / LogSoftmax

def _softmax_like(name: str, snake: str, log: bool) -> None:
    def infer(specs, attrs):
        (x,) = specs
        check_dtype(name, "input", x, FLOATS)
        norm_axis(name, attr_int(name, attrs, "axis", -1), len(x.shape))
        return [TensorSpec(x.shape, x.dtype)]

    def compute(inputs, outputs, attrs):
        x = wide(inputs[0])
        axis = norm_axis(name, attr_int(name, attrs, "axis", -1), x.ndim)
        shifted = x - np.max(x, axis=axis, keepdims=True)  # max-shift keeps exp in range
        if log:
            outputs[0][...] = shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
        else:
            e = np.exp(shifted)
            outputs[0][...] = e / np.sum(e, axis=axis, keepdims=True)

    compute.__doc__ = (f"{'log ' if log else ''}softmax along ``axis`` (default -1): "
                       + ("x - max - log(sum(exp(x - max)))." if log else "exp(x - max) / sum(exp(x - max))."))
    define(name, snake, infer, compute, attrs=("axis",))


_softmax_like("Softmax", "softmax", log=False)
_softmax_like("LogSoftmax", "log_softmax", log=True)


# ---------------------------------------------------------------- LayerNormalization

def stats_dtype(dtype: np.dtype) -> np.dtype:
    """Dtype of Mean / InvStdDev: float32 (ONNX stash_type=1), float64 for float64 inputs."""
    return F64 if dtype == F64 else F32


def layer_norm_shapes(op: str, x: TensorSpec, scale: TensorSpec, attrs: dict) -> tuple[int, tuple[int, ...]]:
    """Check X and Scale of a (forward or backward) layer norm; returns (axis, Mean/InvStdDev shape)."""
    check_dtype(op, "X", x, FLOATS)
    axis = norm_axis(op, attr_int(op, attrs, "axis", -1), len(x.shape))
    broadcasts_to(op, "Scale", scale.shape, x.shape[axis:], "the normalized shape X.shape[axis:]")
    return axis, x.shape[:axis] + (1,) * (len(x.shape) - axis)


def _layer_norm_infer(specs, attrs):
    x, scale = specs[:2]
    named = [("X", x), ("Scale", scale)] + ([("B", specs[2])] if len(specs) == 3 else [])
    same_dtype("LayerNormalization", named)
    axis, stat_shape = layer_norm_shapes("LayerNormalization", x, scale, attrs)
    if len(specs) == 3:
        broadcasts_to("LayerNormalization", "B", specs[2].shape, x.shape[axis:], "the normalized shape X.shape[axis:]")
    if attr_float("LayerNormalization", attrs, "epsilon", 1e-5) < 0:
        raise invalid("LayerNormalization", f"epsilon={attrs['epsilon']} (expected >= 0)")
    if attr_int("LayerNormalization", attrs, "stash_type", 1) != 1:
        raise invalid("LayerNormalization", f"stash_type={attrs['stash_type']} (only 1, float32 statistics, "
                                            f"is supported)")
    sdt = stats_dtype(x.dtype)
    return [TensorSpec(x.shape, x.dtype), TensorSpec(stat_shape, sdt), TensorSpec(stat_shape, sdt)]


def _layer_norm_compute(inputs, outputs, attrs):
    """Y = (X - mean) · InvStdDev · Scale + B over dims ``axis..`` ; also outputs Mean and InvStdDev.

    InvStdDev = 1 / sqrt(var + epsilon) with the biased variance (as ONNX and torch).
    """
    x = inputs[0]
    axis = norm_axis("LayerNormalization", attr_int("LayerNormalization", attrs, "axis", -1), x.ndim)
    eps = attr_float("LayerNormalization", attrs, "epsilon", 1e-5)
    sdt = stats_dtype(x.dtype)
    xs = x.astype(sdt)
    axes = tuple(range(axis, x.ndim))
    mean = xs.mean(axis=axes, keepdims=True)
    centered = xs - mean
    inv_std = 1.0 / np.sqrt((centered * centered).mean(axis=axes, keepdims=True) + sdt.type(eps))
    y = centered * inv_std * inputs[1].astype(sdt)
    if len(inputs) == 3:
        y = y + inputs[2].astype(sdt)
    outputs[0][...] = y
    outputs[1][...] = mean
    outputs[2][...] = inv_std


define("LayerNormalization", "layer_normalization", _layer_norm_infer, _layer_norm_compute,
       attrs=("axis", "epsilon", "stash_type"), min_inputs=2, max_inputs=3)
