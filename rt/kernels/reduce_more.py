"""The other ONNX reductions: ReduceMin, ReduceProd, ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum,
ReduceLogSumExp (and the running sum CumSum, ``axis`` an attribute), with ``reduce.py``'s conventions (``axes`` an attribute; empty or absent reduces all
unless noop_with_empty_axes=1; ``keepdims`` default 1; fp16/bf16 accumulate in float32).
Over an empty set: ReduceMin gives the dtype's largest value (+inf for floats), ReduceProd 1, the
sums 0, ReduceLogSum and ReduceLogSumExp -inf.
"""

from __future__ import annotations

import numpy as np

from .common import FLOATS, NUMERIC, attr_bool, attr_int, check_dtype, define, invalid, norm_axis, wide
from .opdef import TensorSpec
from .reduce import _REDUCERS as REDUCERS
from .reduce import _reduction


def _highest(dtype: np.dtype):
    return np.iinfo(dtype).max if dtype.kind in "iu" else np.inf


def _log_sum_exp(x, axes):
    peak = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    peak = np.where(np.isfinite(peak), peak, 0.0)  # all -inf (or empty): no shift
    return np.log(np.sum(np.exp(x - peak), axis=axes, keepdims=True)) + peak


REDUCERS.update({  # registered with reduce.py's, which defines each op the same way
    "ReduceMin": lambda x, axes: np.min(x, axis=axes, keepdims=True, initial=_highest(x.dtype)),
    "ReduceProd": lambda x, axes: np.prod(x, axis=axes, keepdims=True),
    "ReduceL1": lambda x, axes: np.sum(np.abs(x), axis=axes, keepdims=True),
    "ReduceL2": lambda x, axes: np.sqrt(np.sum(x * x, axis=axes, keepdims=True)),
    "ReduceSumSquare": lambda x, axes: np.sum(x * x, axis=axes, keepdims=True),
    "ReduceLogSum": lambda x, axes: np.log(np.sum(x, axis=axes, keepdims=True)),
    "ReduceLogSumExp": _log_sum_exp,
})
_DOCS = {
    "ReduceMin": "minimum", "ReduceProd": "product", "ReduceL1": "sum of |x|", "ReduceL2": "sqrt of the sum of x²",
    "ReduceSumSquare": "sum of x²", "ReduceLogSum": "ln of the sum", "ReduceLogSumExp": "ln of the sum of exp(x)",
}


def _doc(name: str) -> str:
    return f"reduced = {_DOCS[name]} of data over ``axes`` (all by default)."


_reduction("ReduceMin", "reduce_min", NUMERIC, _doc("ReduceMin"))
_reduction("ReduceProd", "reduce_prod", NUMERIC, _doc("ReduceProd"))
_reduction("ReduceL1", "reduce_l1", NUMERIC, _doc("ReduceL1"))
_reduction("ReduceL2", "reduce_l2", FLOATS, _doc("ReduceL2"))
_reduction("ReduceSumSquare", "reduce_sum_square", NUMERIC, _doc("ReduceSumSquare"))
_reduction("ReduceLogSum", "reduce_log_sum", FLOATS, _doc("ReduceLogSum"))
_reduction("ReduceLogSumExp", "reduce_log_sum_exp", FLOATS, _doc("ReduceLogSumExp"))


# ---------------------------------------------------------------- CumSum

def _cumsum_infer(specs, attrs):
    (x,) = specs
    check_dtype("CumSum", "x", x, NUMERIC)
    if not x.shape:
        raise invalid("CumSum", "x is a scalar (expected rank >= 1)")
    norm_axis("CumSum", attr_int("CumSum", attrs, "axis"), len(x.shape))
    attr_bool("CumSum", attrs, "exclusive", False)
    attr_bool("CumSum", attrs, "reverse", False)
    return [TensorSpec(x.shape, x.dtype)]


def _cumsum_compute(inputs, outputs, attrs):
    """y = running sums of x along ``axis`` (an attribute here, ONNX's input); ``exclusive=1`` leaves
    out the element itself, ``reverse=1`` sums from the end."""
    x = wide(inputs[0])
    axis = norm_axis("CumSum", attr_int("CumSum", attrs, "axis"), x.ndim)
    reverse = attr_bool("CumSum", attrs, "reverse", False)
    if reverse:
        x = np.flip(x, axis)
    y = np.cumsum(x, axis=axis)
    if attr_bool("CumSum", attrs, "exclusive", False):
        y = y - x
    outputs[0][...] = np.flip(y, axis) if reverse else y


define("CumSum", "cumsum", _cumsum_infer, _cumsum_compute, attrs=("axis", "exclusive", "reverse"))
