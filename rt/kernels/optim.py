"""Optimizer steps applied in place on card memory: SGDMomentum and Adam/AdamW (torch.optim formulas).

Both ops have no outputs: they update their parameter and state inputs in place
(``OpDef.inplace``). State tensors start at zero, as torch's lazily created buffers do.
fp16/bf16 tensors are updated in float32 and rounded back once.
"""

from __future__ import annotations

import math

import numpy as np

from .common import (FLOATS, attr_bool, attr_float, attr_int, check_dtype, define, invalid, merge_shapes,
                     same_dtype, wide)


def _check_tensors(op: str, specs, names) -> None:
    named = list(zip(names, specs))
    check_dtype(op, names[0], specs[0], FLOATS)
    same_dtype(op, named)
    merge_shapes(op, [(name, spec.shape) for name, spec in named])


def _check_range(op: str, name: str, value: float, low: float, below: float | None = None) -> float:
    """``low <= value`` (and ``value < below`` when given), as torch.optim validates its arguments."""
    if value < low or (below is not None and value >= below):
        bound = "" if below is None else f" and < {below}"
        raise invalid(op, f"{name}={value} (expected >= {low}{bound})")
    return value


# ---------------------------------------------------------------- SGD with momentum

def _sgd_attrs(attrs: dict) -> tuple[float, float, float, bool]:
    op = "SGDMomentum"
    lr = _check_range(op, "lr", attr_float(op, attrs, "lr"), 0.0)
    momentum = _check_range(op, "momentum", attr_float(op, attrs, "momentum", 0.9), 0.0)
    weight_decay = _check_range(op, "weight_decay", attr_float(op, attrs, "weight_decay", 0.0), 0.0)
    nesterov = attr_bool(op, attrs, "nesterov", False)
    if nesterov and momentum == 0:
        raise invalid(op, "nesterov=True needs momentum > 0 (got momentum=0)")
    return lr, momentum, weight_decay, nesterov


def _sgd_infer(specs, attrs):
    _check_tensors("SGDMomentum", specs, ("param", "grad", "velocity"))
    _sgd_attrs(attrs)
    return []


def _sgd_compute(inputs, outputs, attrs):
    """One torch.optim.SGD step (dampening 0), updating param and velocity in place::

        g = grad + weight_decay·param
        velocity = momentum·velocity + g
        g = g + momentum·velocity   if nesterov   else   velocity
        param = param - lr·g
    """
    param, grad, velocity = inputs
    lr, momentum, weight_decay, nesterov = _sgd_attrs(attrs)
    p, g, v = wide(param), wide(grad), wide(velocity)
    if weight_decay:
        g = g + weight_decay * p
    v = momentum * v + g
    step = g + momentum * v if nesterov else v
    velocity[...] = v
    param[...] = p - lr * step


define("SGDMomentum", "sgd_momentum", _sgd_infer, _sgd_compute,
       attrs=("lr", "momentum", "weight_decay", "nesterov"), min_inputs=3, inplace=(0, 2))


# ---------------------------------------------------------------- Adam / AdamW

def _adam_attrs(attrs: dict) -> tuple:
    op = "Adam"
    lr = _check_range(op, "lr", attr_float(op, attrs, "lr"), 0.0)
    beta1 = _check_range(op, "beta1", attr_float(op, attrs, "beta1", 0.9), 0.0, 1.0)
    beta2 = _check_range(op, "beta2", attr_float(op, attrs, "beta2", 0.999), 0.0, 1.0)
    eps = _check_range(op, "epsilon", attr_float(op, attrs, "epsilon", 1e-8), 0.0)
    weight_decay = _check_range(op, "weight_decay", attr_float(op, attrs, "weight_decay", 0.0), 0.0)
    step = attr_int(op, attrs, "step")
    if step < 1:
        raise invalid(op, f"step={step} (expected the 1-based step count, >= 1, for bias correction)")
    return lr, beta1, beta2, eps, weight_decay, step, attr_bool(op, attrs, "decoupled", False)


def _adam_infer(specs, attrs):
    _check_tensors("Adam", specs, ("param", "grad", "m", "v"))
    _adam_attrs(attrs)
    return []


def _adam_compute(inputs, outputs, attrs):
    """One torch.optim.Adam (decoupled=False) or AdamW (decoupled=True) step, in place on param, m, v::

        Adam:  g = grad + weight_decay·param          AdamW: param = param·(1 - lr·weight_decay); g = grad
        m = beta1·m + (1 - beta1)·g
        v = beta2·v + (1 - beta2)·g²
        param = param - lr/(1 - beta1^step) · m / (sqrt(v)/sqrt(1 - beta2^step) + epsilon)
    """
    param, grad, m_buf, v_buf = inputs
    lr, beta1, beta2, eps, weight_decay, step, decoupled = _adam_attrs(attrs)
    p, g, m, v = wide(param), wide(grad), wide(m_buf), wide(v_buf)
    if decoupled:
        p = p * (1.0 - lr * weight_decay)
    elif weight_decay:
        g = g + weight_decay * p
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * (g * g)
    bias1, bias2 = 1.0 - beta1 ** step, 1.0 - beta2 ** step
    denom = np.sqrt(v) / math.sqrt(bias2) + eps
    m_buf[...] = m
    v_buf[...] = v
    param[...] = p - (lr / bias1) * m / denom


define("Adam", "adam", _adam_infer, _adam_compute,
       attrs=("lr", "beta1", "beta2", "epsilon", "weight_decay", "step", "decoupled"),
       min_inputs=4, inplace=(0, 2, 3))
