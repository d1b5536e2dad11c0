"""Elementwise ops: Add/Sub/Mul/Div/Pow, unary math, activations, Where, Cast, Identity.

Binary and ternary ops broadcast like numpy. Inputs of one op must share a dtype (no silent
promotion). fp16/bf16 math runs in float32 and is rounded back once, at the end.
"""

from __future__ import annotations

import math

import numpy as np

from ..dtypes import np_dtype
from ..errors import AclError
from .common import (ALL, BOOL, FLOATS, NUMERIC, SIGNED_INTS, attr_str, broadcast, check_dtype, define, erf,
                     invalid, same_dtype, unsupported, wide)
from .opdef import TensorSpec

GELU_MODES = ("none", "tanh")
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_TANH_COEF = 0.044715


# ---------------------------------------------------------------- binary arithmetic

def _binary(name: str, snake: str, fn, dtypes, doc: str) -> None:
    def infer(specs, attrs):
        a, b = specs
        check_dtype(name, "A", a, dtypes)
        dtype = same_dtype(name, [("A", a), ("B", b)])
        return [TensorSpec(broadcast(name, [("A", a.shape), ("B", b.shape)]), dtype)]

    def compute(inputs, outputs, attrs):
        a, b = inputs
        outputs[0][...] = fn(wide(a), wide(b))

    compute.__doc__ = doc
    define(name, snake, infer, compute, min_inputs=2)


_binary("Add", "add", np.add, NUMERIC, "C = A + B (numpy broadcasting; ints wrap).")
_binary("Sub", "sub", np.subtract, NUMERIC, "C = A - B (numpy broadcasting; ints wrap).")
_binary("Mul", "mul", np.multiply, NUMERIC, "C = A * B (numpy broadcasting; ints wrap).")
_binary("Div", "div", np.divide, FLOATS, "C = A / B (numpy broadcasting; x/0 gives inf or nan).")


def _pow_infer(specs, attrs):
    x, y = specs
    check_dtype("Pow", "X", x, FLOATS)
    check_dtype("Pow", "Y", y, NUMERIC)  # ONNX Pow-15: the exponent may have another numeric dtype
    return [TensorSpec(broadcast("Pow", [("X", x.shape), ("Y", y.shape)]), x.dtype)]


def _pow_compute(inputs, outputs, attrs):
    """Z = X ** Y (numpy broadcasting; Y of any numeric dtype, Z has X's float dtype)."""
    x = wide(inputs[0])
    outputs[0][...] = np.power(x, wide(inputs[1]).astype(x.dtype))


define("Pow", "pow", _pow_infer, _pow_compute, min_inputs=2)


# ---------------------------------------------------------------- unary math and activations

def _unary(name: str, snake: str, fn, dtypes, doc: str, attrs=(), check_attrs=None) -> None:
    def infer(specs, attr_dict):
        (x,) = specs
        check_dtype(name, "X", x, dtypes)
        if check_attrs is not None:
            check_attrs(attr_dict)
        return [TensorSpec(x.shape, x.dtype)]

    def compute(inputs, outputs, attr_dict):
        outputs[0][...] = fn(wide(inputs[0]), attr_dict)

    compute.__doc__ = doc
    define(name, snake, infer, compute, attrs=attrs)


def _sigmoid(x, attrs):
    # Split by sign so that exp never overflows: 1/(1+e^-x) for x >= 0, e^x/(1+e^x) below.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def gelu(x: np.ndarray, mode: str) -> np.ndarray:
    """GELU of a float32/float64 array: x·Φ(x) exactly, or the tanh approximation."""
    if mode == "tanh":
        return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * (x + GELU_TANH_COEF * x ** 3)))
    return (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(x.dtype)


def gelu_mode(op: str, attrs: dict) -> str:
    return attr_str(op, attrs, "approximate", "none", GELU_MODES)


def _gelu(x, attrs):
    return gelu(x, gelu_mode("Gelu", attrs))

_unary("Neg", "neg", lambda x, _: np.negative(x), FLOATS + SIGNED_INTS, "Y = -X (ints wrap).")
_unary("Exp", "exp", lambda x, _: np.exp(x), FLOATS, "Y = exp(X).")
_unary("Log", "log", lambda x, _: np.log(x), FLOATS, "Y = ln(X) (nan below 0, -inf at 0).")
_unary("Sqrt", "sqrt", lambda x, _: np.sqrt(x), FLOATS, "Y = sqrt(X) (nan below 0).")
_unary("Relu", "relu", lambda x, _: np.maximum(x, 0), FLOATS, "Y = max(X, 0).")
_unary("Sigmoid", "sigmoid", _sigmoid, FLOATS, "Y = 1 / (1 + exp(-X)), computed without overflow.")
_unary("Tanh", "tanh", lambda x, _: np.tanh(x), FLOATS, "Y = tanh(X).")
_unary("Gelu", "gelu", _gelu, FLOATS,
       "Y = X·Φ(X) (approximate='none', Φ the normal CDF via erf) or "
       "0.5·X·(1 + tanh(√(2/π)·(X + 0.044715·X³))) (approximate='tanh').",
       attrs=("approximate",), check_attrs=lambda attrs: gelu_mode("Gelu", attrs))
_unary("Identity", "identity", lambda x, _: x, ALL, "Y = X (a copy).")


# ---------------------------------------------------------------- Where and Cast

def _where_infer(specs, attrs):
    cond, x, y = specs
    check_dtype("Where", "condition", cond, BOOL)
    check_dtype("Where", "X", x, ALL)
    dtype = same_dtype("Where", [("X", x), ("Y", y)])
    return [TensorSpec(broadcast("Where", [("condition", cond.shape), ("X", x.shape), ("Y", y.shape)]), dtype)]


def _where_compute(inputs, outputs, attrs):
    """output = X where condition else Y (numpy broadcasting over all three)."""
    cond, x, y = inputs
    outputs[0][...] = np.where(cond, x, y)


define("Where", "where", _where_infer, _where_compute, min_inputs=3)


def cast_target(attrs: dict) -> np.dtype:
    """The ``to`` attribute as a numpy dtype: an ACL dtype code (0 = float32) or a dtype name."""
    if "to" not in attrs or attrs["to"] is None:
        raise invalid("Cast", "attribute 'to' is required (an ACL dtype code or a dtype name)")
    to = attrs["to"]
    if isinstance(to, bytes):
        to = to.decode("utf-8", "replace")
    try:
        dtype = np_dtype(to)
    except AclError as exc:
        raise unsupported("Cast", f"attribute to={to!r}: {exc.message}") from None
    if dtype not in ALL:
        raise unsupported("Cast", f"attribute to={to!r} is {dtype}, expected one of: {', '.join(map(str, ALL))}")
    return dtype


def _cast_infer(specs, attrs):
    (x,) = specs
    check_dtype("Cast", "input", x, ALL)
    return [TensorSpec(x.shape, cast_target(attrs))]


def _cast_compute(inputs, outputs, attrs):
    """output = input converted to dtype ``to`` (floats to ints truncate toward zero, as numpy)."""
    outputs[0][...] = inputs[0].astype(outputs[0].dtype)


define("Cast", "cast", _cast_infer, _cast_compute, attrs=("to",))
