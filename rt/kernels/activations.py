"""More elementwise ops of exported models (ONNX semantics): Clip, Erf, HardSigmoid, HardSwish,
LeakyRelu, PRelu, Softplus, Softsign, Mish, Elu, Selu, Sign, Sin, Cos, Abs, Reciprocal, Floor, Ceil,
Dropout (inference); the comparisons and logic ops Equal, Less, LessOrEqual, Greater, GreaterOrEqual,
Not, And, Or, Xor; the variadic Min, Max, Sum, Mean (any number of inputs, broadcast together); Mod.

Clip's ``min``/``max`` are attributes here (ONNX passes them as optional inputs; a converter folds
the constants); Dropout takes ``ratio``/``training_mode`` either way. fp16/bf16 math runs in float32.
"""

from __future__ import annotations

import math

import numpy as np

from .common import (
    ALL,
    BOOL,
    F64,
    FLOATS,
    MAX_INPUTS,
    NUMERIC,
    SIGNED_INTS,
    attr_float,
    attr_int,
    broadcast,
    broadcasts_to,
    check_dtype,
    define,
    invalid,
    same_dtype,
    wide,
)
from .opdef import TensorSpec

_ERF_SERIES = tuple((-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(12))
# Chebyshev fit of erfc for z >= 0 (Numerical Recipes' erfcc): fractional error below 1.2e-7.
_ERFC_COEFS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
               1.48851587, -0.82215223, 0.17087277)


def fast_erf(x: np.ndarray) -> np.ndarray:
    """Vectorized erf in float64: the Maclaurin series below |x| = 0.5 (error < 1e-15), a Chebyshev
    erfc fit above (error < 1.2e-7 relative to erfc): float32-accurate, without a per-element call."""
    x = np.asarray(x, dtype=F64)
    z = np.abs(x)
    small = z < 0.5
    x2 = np.where(small, x * x, 0.0)
    series = np.zeros_like(x)
    for c in reversed(_ERF_SERIES):
        series = series * x2 + c
    series *= (2.0 / math.sqrt(math.pi)) * x
    t = 1.0 / (1.0 + 0.5 * z)
    poly = np.zeros_like(x)
    for c in reversed(_ERFC_COEFS):
        poly = poly * t + c
    erfc = t * np.exp(-z * z + poly)
    return np.where(small, series, np.sign(x) * (1.0 - erfc))


# ---------------------------------------------------------------- unary

def _unary(name: str, snake: str, fn, dtypes, doc: str, attrs=(), check=None) -> None:
    def infer(specs, attr_dict):
        (x,) = specs
        check_dtype(name, "X", x, dtypes)
        if check is not None:
            check(x, attr_dict)
        return [TensorSpec(x.shape, x.dtype)]

    def compute(inputs, outputs, attr_dict):
        outputs[0][...] = fn(wide(inputs[0]), attr_dict)

    compute.__doc__ = doc
    define(name, snake, infer, compute, attrs=attrs)


def _clip_bounds(x: TensorSpec | np.ndarray, attrs: dict):
    lo = attrs.get("min")
    hi = attrs.get("max")
    for key, value in (("min", lo), ("max", hi)):
        if value is None:
            continue
        attr_float("Clip", attrs, key)
        if x.dtype.kind in "iu" and not float(value).is_integer():
            raise invalid("Clip", f"attribute {key}={value!r} is not an integer but input is {x.dtype}")
    return lo, hi


def _bound(x: np.ndarray, value) -> np.generic:
    if x.dtype.kind in "iu":  # a bound beyond the int dtype's range clips nothing on that side
        info = np.iinfo(x.dtype)
        return x.dtype.type(min(max(int(value), info.min), info.max))
    return x.dtype.type(value)


def _clip(x, attrs):
    lo, hi = _clip_bounds(x, attrs)
    y = x if lo is None else np.maximum(x, _bound(x, lo))
    return y if hi is None else np.minimum(y, _bound(x, hi))  # min > max gives max everywhere


def _hard_sigmoid(x, attrs):
    alpha, beta = attr_float("HardSigmoid", attrs, "alpha", 0.2), attr_float("HardSigmoid", attrs, "beta", 0.5)
    return np.clip(alpha * x + beta, 0.0, 1.0)


def _leaky(x, attrs):
    return np.where(x >= 0, x, x * attr_float("LeakyRelu", attrs, "alpha", 0.01))


SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875  # ONNX's float32 defaults


def _elu(x, attrs):
    return np.where(x >= 0, x, attr_float("Elu", attrs, "alpha", 1.0) * np.expm1(np.minimum(x, 0)))


def _selu(x, attrs):
    alpha, gamma = attr_float("Selu", attrs, "alpha", SELU_ALPHA), attr_float("Selu", attrs, "gamma", SELU_GAMMA)
    return gamma * np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


def _dropout_check(x, attrs):
    ratio = attr_float("Dropout", attrs, "ratio", 0.5)
    if not 0.0 <= ratio < 1.0:
        raise invalid("Dropout", f"ratio={ratio} (expected 0 <= ratio < 1)")
    if attr_int("Dropout", attrs, "training_mode", 0):
        raise invalid("Dropout", "training_mode=1 (only inference, where Dropout is the identity, is supported)")
    attr_int("Dropout", attrs, "seed", 0)


def _floats_attr(name: str, *keys_defaults):
    return lambda x, attrs: [attr_float(name, attrs, k, d) for k, d in keys_defaults]


_unary("Clip", "clip", _clip, NUMERIC, "output = min(max(input, min), max); absent bounds do not clip.",
       attrs=("min", "max"), check=_clip_bounds)
_unary("Erf", "erf", lambda x, _: fast_erf(x), FLOATS, "Y = erf(X) (float32-accurate).")
_unary("HardSigmoid", "hard_sigmoid", _hard_sigmoid, FLOATS, "Y = max(0, min(1, alpha·X + beta)).",
       attrs=("alpha", "beta"), check=_floats_attr("HardSigmoid", ("alpha", 0.2), ("beta", 0.5)))
_unary("HardSwish", "hard_swish", lambda x, _: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0), FLOATS,
       "Y = X · max(0, min(1, X/6 + 1/2)).")
_unary("LeakyRelu", "leaky_relu", _leaky, FLOATS, "Y = X where X >= 0, alpha·X below (alpha 0.01).",
       attrs=("alpha",), check=_floats_attr("LeakyRelu", ("alpha", 0.01)))
_unary("Softplus", "softplus", lambda x, _: np.logaddexp(0.0, x), FLOATS, "Y = ln(1 + exp(X)), without overflow.")
_unary("Softsign", "softsign", lambda x, _: x / (1.0 + np.abs(x)), FLOATS, "Y = X / (1 + |X|).")
_unary("Mish", "mish", lambda x, _: x * np.tanh(np.logaddexp(0.0, x)), FLOATS, "Y = X · tanh(softplus(X)).")
_unary("Elu", "elu", _elu, FLOATS, "Y = X where X >= 0, alpha·(exp(X) - 1) below (alpha 1).",
       attrs=("alpha",), check=_floats_attr("Elu", ("alpha", 1.0)))
_unary("Selu", "selu", _selu, FLOATS, "Y = gamma·X where X > 0, gamma·alpha·(exp(X) - 1) below (ONNX defaults).",
       attrs=("alpha", "gamma"), check=_floats_attr("Selu", ("alpha", SELU_ALPHA), ("gamma", SELU_GAMMA)))
_unary("Sign", "sign", lambda x, _: np.sign(x), NUMERIC, "Y = -1, 0 or 1 by the sign of X.")
_unary("Sin", "sin", lambda x, _: np.sin(x), FLOATS, "Y = sin(X).")
_unary("Cos", "cos", lambda x, _: np.cos(x), FLOATS, "Y = cos(X).")
_unary("Abs", "absolute", lambda x, _: np.abs(x), NUMERIC, "Y = |X| (ints wrap at the lowest value).")
_unary("Reciprocal", "reciprocal", lambda x, _: 1.0 / x, FLOATS, "Y = 1 / X (inf at 0).")
_unary("Floor", "floor", lambda x, _: np.floor(x), FLOATS, "Y = floor(X).")
_unary("Ceil", "ceil", lambda x, _: np.ceil(x), FLOATS, "Y = ceil(X).")


# ---------------------------------------------------------------- Dropout (inference)

def _dropout_infer(specs, attrs):
    x = specs[0]
    check_dtype("Dropout", "data", x, FLOATS)
    for name, spec, dtypes in zip(("ratio", "training_mode"), specs[1:], (FLOATS, BOOL)):
        check_dtype("Dropout", name, spec, dtypes)
        if spec.shape != ():
            raise invalid("Dropout", f"{name} has shape {spec.shape} (expected a scalar)")
    _dropout_check(x, attrs)
    return [TensorSpec(x.shape, x.dtype)]


def _dropout_compute(inputs, outputs, attrs):
    """output = data: inference, where Dropout is the identity (no mask output). ``ratio`` and
    ``training_mode`` come as attributes or as ONNX's optional scalar inputs; training_mode=1 is refused."""
    if len(inputs) == 3 and bool(inputs[2]):
        raise invalid("Dropout", "training_mode input is true (only inference, where Dropout is the identity, "
                                 "is supported)")
    outputs[0][...] = inputs[0]


define("Dropout", "dropout", _dropout_infer, _dropout_compute, attrs=("ratio", "training_mode", "seed"),
       max_inputs=3)


# ---------------------------------------------------------------- PRelu

def _prelu_infer(specs, attrs):
    x, slope = specs
    check_dtype("PRelu", "X", x, FLOATS + SIGNED_INTS[2:])
    dtype = same_dtype("PRelu", [("X", x), ("slope", slope)])
    broadcasts_to("PRelu", "slope", slope.shape, x.shape, "X")
    return [TensorSpec(x.shape, dtype)]


def _prelu_compute(inputs, outputs, attrs):
    """Y = X where X >= 0, slope·X below (slope broadcasts to X)."""
    x, slope = wide(inputs[0]), wide(inputs[1])
    outputs[0][...] = np.where(x >= 0, x, x * slope)


define("PRelu", "prelu", _prelu_infer, _prelu_compute, min_inputs=2)


# ---------------------------------------------------------------- comparisons and logic

def _compare(name: str, snake: str, fn, dtypes, doc: str) -> None:
    def infer(specs, attrs):
        a, b = specs
        check_dtype(name, "A", a, dtypes)
        same_dtype(name, [("A", a), ("B", b)])
        return [TensorSpec(broadcast(name, [("A", a.shape), ("B", b.shape)]), BOOL[0])]

    def compute(inputs, outputs, attrs):
        outputs[0][...] = fn(inputs[0], inputs[1])

    compute.__doc__ = doc
    define(name, snake, infer, compute, min_inputs=2)


_compare("Equal", "equal", np.equal, ALL, "C = (A == B), bool (numpy broadcasting).")
_compare("Less", "less", np.less, NUMERIC, "C = (A < B), bool (numpy broadcasting).")
_compare("LessOrEqual", "less_equal", np.less_equal, NUMERIC, "C = (A <= B), bool (numpy broadcasting).")
_compare("Greater", "greater", np.greater, NUMERIC, "C = (A > B), bool (numpy broadcasting).")
_compare("GreaterOrEqual", "greater_equal", np.greater_equal, NUMERIC, "C = (A >= B), bool (numpy broadcasting).")
_compare("And", "logical_and", np.logical_and, BOOL, "C = A and B, bool (numpy broadcasting).")
_compare("Or", "logical_or", np.logical_or, BOOL, "C = A or B, bool (numpy broadcasting).")
_compare("Xor", "logical_xor", np.logical_xor, BOOL, "C = A xor B, bool (numpy broadcasting).")
_unary("Not", "logical_not", lambda x, _: np.logical_not(x), BOOL, "Y = not X, bool.")


# ---------------------------------------------------------------- variadic Min / Max / Sum / Mean

def _variadic(name: str, snake: str, fn, dtypes, mean: bool, doc: str) -> None:
    def infer(specs, attrs):
        check_dtype(name, "data_0", specs[0], dtypes)
        dtype = same_dtype(name, [(f"data_{i}", s) for i, s in enumerate(specs)])
        return [TensorSpec(broadcast(name, [(f"data_{i}", s.shape) for i, s in enumerate(specs)]), dtype)]

    def compute(inputs, outputs, attrs):
        acc = wide(inputs[0])
        for other in inputs[1:]:
            acc = fn(acc, wide(other))
        acc = np.broadcast_to(acc, outputs[0].shape)
        outputs[0][...] = acc / len(inputs) if mean else acc

    compute.__doc__ = doc
    define(name, snake, infer, compute, max_inputs=MAX_INPUTS)


_variadic("Min", "minimum", np.minimum, NUMERIC, False, "min = elementwise minimum of the inputs (nan wins).")
_variadic("Max", "maximum", np.maximum, NUMERIC, False, "max = elementwise maximum of the inputs (nan wins).")
_variadic("Sum", "sum_n", np.add, FLOATS, False, "sum = elementwise sum of the inputs.")
_variadic("Mean", "mean_n", np.add, FLOATS, True, "mean = elementwise mean of the inputs.")


# ---------------------------------------------------------------- Mod

def _mod_infer(specs, attrs):
    a, b = specs
    check_dtype("Mod", "A", a, NUMERIC)
    dtype = same_dtype("Mod", [("A", a), ("B", b)])
    fmod = attr_int("Mod", attrs, "fmod", 0)
    if fmod not in (0, 1):
        raise invalid("Mod", f"fmod={fmod} (expected 0 or 1)")
    if dtype in FLOATS and not fmod:
        raise invalid("Mod", f"fmod=0 with {dtype} inputs (ONNX requires fmod=1 for floats)")
    return [TensorSpec(broadcast("Mod", [("A", a.shape), ("B", b.shape)]), dtype)]


def _mod_compute(inputs, outputs, attrs):
    """C = A mod B: the sign of B (Python's %) with fmod=0, the sign of A (C's fmod) with fmod=1."""
    a, b = wide(inputs[0]), wide(inputs[1])
    outputs[0][...] = np.fmod(a, b) if attr_int("Mod", attrs, "fmod", 0) else np.mod(a, b)


define("Mod", "mod", _mod_infer, _mod_compute, attrs=("fmod",), min_inputs=2)
