"""Training kernels: activation / normalization gradients and softmax cross-entropy (ONNX names).

Backward ops take the forward's saved values (X, Y, Mean, InvStdDev, log_prob) and return
gradients with respect to the forward inputs, shaped like them.
"""

from __future__ import annotations

import math

import numpy as np

from .common import (FLOATS, INDEX, attr_int, attr_str, check_dtype, define, erf, invalid, merge_shapes,
                     norm_axis, same_dtype, sum_to_shape, wide)
from .elementwise import GELU_TANH_COEF, SQRT_2_OVER_PI, gelu_mode
from .nn import layer_norm_shapes, stats_dtype
from .opdef import TensorSpec

REDUCTIONS = ("mean", "sum", "none")


def _same_as(op: str, named, dtypes=FLOATS) -> TensorSpec:
    """Specs that must agree in shape and dtype; returns the merged spec (for dX-like outputs)."""
    check_dtype(op, named[0][0], named[0][1], dtypes)
    dtype = same_dtype(op, named)
    return TensorSpec(merge_shapes(op, [(name, spec.shape) for name, spec in named]), dtype)


# ---------------------------------------------------------------- ReluGrad / GeluGrad / SoftmaxGrad

def _relu_grad_infer(specs, attrs):
    return [_same_as("ReluGrad", [("dY", specs[0]), ("X", specs[1])])]


def _relu_grad_compute(inputs, outputs, attrs):
    """dX = dY where X > 0, else 0."""
    dy, x = inputs
    outputs[0][...] = np.where(x > 0, dy, 0)


define("ReluGrad", "relu_grad", _relu_grad_infer, _relu_grad_compute, min_inputs=2)


def _gelu_grad_infer(specs, attrs):
    gelu_mode("GeluGrad", attrs)
    return [_same_as("GeluGrad", [("dY", specs[0]), ("X", specs[1])])]


def _gelu_grad_compute(inputs, outputs, attrs):
    """dX = dY · GELU'(X); exact: Φ(x) + x·φ(x); tanh: 0.5(1+t) + 0.5x(1-t²)·√(2/π)(1+3c·x²)."""
    dy, x = wide(inputs[0]), wide(inputs[1])
    if gelu_mode("GeluGrad", attrs) == "tanh":
        t = np.tanh(SQRT_2_OVER_PI * (x + GELU_TANH_COEF * x ** 3))
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * SQRT_2_OVER_PI * (1 + 3 * GELU_TANH_COEF * x * x)
    else:
        cdf = 0.5 * (1.0 + erf(x / math.sqrt(2.0)))
        d = cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    outputs[0][...] = dy * d


define("GeluGrad", "gelu_grad", _gelu_grad_infer, _gelu_grad_compute, attrs=("approximate",), min_inputs=2)


def _softmax_grad_infer(specs, attrs):
    spec = _same_as("SoftmaxGrad", [("dY", specs[0]), ("Y", specs[1])])
    norm_axis("SoftmaxGrad", attr_int("SoftmaxGrad", attrs, "axis", -1), len(spec.shape))
    return [spec]


def _softmax_grad_compute(inputs, outputs, attrs):
    """dX = Y · (dY - sum(dY · Y, axis)) with Y the forward Softmax output."""
    dy, y = wide(inputs[0]), wide(inputs[1])
    axis = norm_axis("SoftmaxGrad", attr_int("SoftmaxGrad", attrs, "axis", -1), y.ndim)
    outputs[0][...] = y * (dy - np.sum(dy * y, axis=axis, keepdims=True))


define("SoftmaxGrad", "softmax_grad", _softmax_grad_infer, _softmax_grad_compute, attrs=("axis",), min_inputs=2)


# ---------------------------------------------------------------- LayerNormalizationGrad

def _ln_grad_infer(specs, attrs):
    op = "LayerNormalizationGrad"
    dy, x, scale, mean, inv_std = specs
    x_spec = _same_as(op, [("dY", dy), ("X", x)])
    same_dtype(op, [("X", x), ("Scale", scale)])
    axis, stat_shape = layer_norm_shapes(op, x_spec, scale, attrs)
    sdt = stats_dtype(x.dtype)
    for name, spec in (("Mean", mean), ("InvStdDev", inv_std)):
        merge_shapes(op, [("the statistics shape X.shape[:axis] + (1,)*k", stat_shape), (name, spec.shape)])
        if spec.dtype != sdt:
            raise invalid(op, f"{name} has dtype {spec.dtype}, expected {sdt} (as LayerNormalization outputs "
                              f"for X of {x.dtype})")
    return [x_spec, TensorSpec(scale.shape, x.dtype), TensorSpec(scale.shape, x.dtype)]


def _ln_grad_compute(inputs, outputs, attrs):
    """dX, dScale, dB of LayerNormalization from dY, X, Scale and the saved Mean / InvStdDev.

    With x̂ = (X - Mean)·InvStdDev and g = dY·Scale, over the normalized axes:
    dX = InvStdDev · (g - mean(g) - x̂·mean(g·x̂)); dScale = Σ dY·x̂ and dB = Σ dY over the
    dims that Scale was broadcast along.
    """
    dy, x, scale, mean, inv_std = inputs
    sdt = stats_dtype(x.dtype)
    axis = norm_axis("LayerNormalizationGrad", attr_int("LayerNormalizationGrad", attrs, "axis", -1), x.ndim)
    axes = tuple(range(axis, x.ndim))
    dy = dy.astype(sdt)
    xhat = (x.astype(sdt) - mean) * inv_std
    g = dy * scale.astype(sdt)
    dx = inv_std * (g - g.mean(axis=axes, keepdims=True) - xhat * (g * xhat).mean(axis=axes, keepdims=True))
    outputs[0][...] = dx
    outputs[1][...] = sum_to_shape(dy * xhat, scale.shape)
    outputs[2][...] = sum_to_shape(dy, scale.shape)


define("LayerNormalizationGrad", "layer_normalization_grad", _ln_grad_infer, _ln_grad_compute,
       attrs=("axis",), min_inputs=5)


# ---------------------------------------------------------------- SoftmaxCrossEntropyLoss (+ Grad)

def _loss_attrs(op: str, attrs: dict) -> tuple[str, int | None]:
    return attr_str(op, attrs, "reduction", "mean", REDUCTIONS), attr_int(op, attrs, "ignore_index", None)


def _scores_labels(op: str, scores: TensorSpec, labels: TensorSpec, scores_name: str) -> tuple[int, int]:
    check_dtype(op, scores_name, scores, FLOATS)
    check_dtype(op, "labels", labels, INDEX)
    if len(scores.shape) != 2 or len(labels.shape) != 1:
        raise invalid(op, f"{scores_name} is {scores.shape} and labels is {labels.shape} "
                          f"(expected {scores_name} [N, C] and labels [N])")
    (n,) = merge_shapes(op, [(f"{scores_name}.shape[0]", scores.shape[:1]), ("labels", labels.shape)])
    return n, scores.shape[1]


def _loss_shape(reduction: str, n: int) -> tuple[int, ...]:
    return (n,) if reduction == "none" else ()


def _valid_labels(op: str, labels: np.ndarray, classes: int, ignore_index: int | None) -> np.ndarray:
    """Mask of rows that count; a label outside [0, C) that is not ignore_index is an error."""
    valid = np.ones(labels.shape, bool) if ignore_index is None else labels != ignore_index
    bad = valid & ((labels < 0) | (labels >= classes))
    if bad.any():
        i = int(np.argmax(bad))
        raise invalid(op, f"label {int(labels[i])} at position {i} is out of range for {classes} classes "
                          f"(expected 0 <= label < {classes}"
                          + (f" or ignore_index {ignore_index})" if ignore_index is not None else ")"))
    return valid


def _sce_infer(specs, attrs):
    op = "SoftmaxCrossEntropyLoss"
    scores, labels = specs
    reduction, _ = _loss_attrs(op, attrs)
    n, c = _scores_labels(op, scores, labels, "scores")
    return [TensorSpec(_loss_shape(reduction, n), scores.dtype), TensorSpec((n, c), scores.dtype)]


def _sce_compute(inputs, outputs, attrs):
    """loss = -log_softmax(scores)[i, labels[i]], reduced by ``reduction``; also outputs log_prob.

    Rows whose label equals ``ignore_index`` contribute 0 and are left out of the mean's count.
    """
    op = "SoftmaxCrossEntropyLoss"
    scores, labels = wide(inputs[0]), inputs[1]
    reduction, ignore_index = _loss_attrs(op, attrs)
    valid = _valid_labels(op, labels, scores.shape[1], ignore_index)
    shifted = scores - scores.max(axis=1, keepdims=True)
    log_prob = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    rows = np.arange(scores.shape[0])
    per_row = np.where(valid, -log_prob[rows, np.where(valid, labels, 0)], 0)
    if reduction == "none":
        outputs[0][...] = per_row
    elif reduction == "sum":
        outputs[0][...] = per_row.sum()
    else:
        outputs[0][...] = per_row.sum() / valid.sum()  # all rows ignored: nan, as torch and ONNX
    outputs[1][...] = log_prob


define("SoftmaxCrossEntropyLoss", "softmax_cross_entropy_loss", _sce_infer, _sce_compute,
       attrs=("reduction", "ignore_index"), min_inputs=2)


def _sce_grad_infer(specs, attrs):
    op = "SoftmaxCrossEntropyLossGrad"
    dloss, log_prob, labels = specs
    reduction, _ = _loss_attrs(op, attrs)
    n, c = _scores_labels(op, log_prob, labels, "log_prob")
    same_dtype(op, [("log_prob", log_prob), ("dloss", dloss)])
    merge_shapes(op, [(f"the loss shape for reduction={reduction!r}", _loss_shape(reduction, n)),
                      ("dloss", dloss.shape)])
    return [TensorSpec((n, c), log_prob.dtype)]


def _sce_grad_compute(inputs, outputs, attrs):
    """dscores = (softmax - onehot(labels)) · dloss (÷ number of counted rows for 'mean')."""
    op = "SoftmaxCrossEntropyLossGrad"
    dloss, log_prob, labels = wide(inputs[0]), wide(inputs[1]), inputs[2]
    reduction, ignore_index = _loss_attrs(op, attrs)
    valid = _valid_labels(op, labels, log_prob.shape[1], ignore_index)
    grad = np.exp(log_prob)
    rows = np.flatnonzero(valid)
    grad[rows, labels[rows]] -= 1
    grad[~valid] = 0
    if reduction == "none":
        scale = dloss[:, None]
    elif reduction == "sum":
        scale = dloss
    else:
        scale = dloss / valid.sum()
    outputs[0][...] = grad * scale


define("SoftmaxCrossEntropyLossGrad", "softmax_cross_entropy_loss_grad", _sce_grad_infer, _sce_grad_compute,
       attrs=("reduction", "ignore_index"), min_inputs=3)
