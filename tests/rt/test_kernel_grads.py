"""Training kernels: gradients against central finite differences of independent numpy forwards
(float64), the cross-entropy loss against a direct formula, and the optimizer steps against the
torch.optim update rules written out by hand for three steps. Pure numpy: no Ray, no card."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rt.dtypes import BFLOAT16
from rt.errors import AclError
from rt.kernels import registry
from rt.kernels.registry import TensorSpec

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
INVALID, UNSUPPORTED = 100000, 100026


def run(op, *inputs, **attrs):
    specs = registry.infer(op, [TensorSpec(a.shape, a.dtype) for a in inputs], attrs)
    outs = [np.full(s.shape, 77, s.dtype) for s in specs]
    registry.get_op(op).compute(list(inputs), outs, attrs)
    return outs[0] if len(outs) == 1 else outs


def numeric_grad(f, x, h=1e-6):
    """d f(x) / dx by central differences, element by element (f returns a scalar)."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + h
        up = f(x)
        x[i] = old - h
        down = f(x)
        x[i] = old
        grad[i] = (up - down) / (2 * h)
    return grad


def expect_error(code, fragment, fn, *args, **kwargs):
    with pytest.raises(AclError) as info:
        fn(*args, **kwargs)
    assert info.value.code == code and fragment in info.value.message, info.value


@pytest.fixture
def rng():
    return np.random.default_rng(7)


# ---------------------------------------------------------------- independent forwards (float64)

def gelu(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(x)


def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def layer_norm(x, scale, bias, axis, eps=1e-5):
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)
    return (x - mean) * inv * scale + bias, mean, inv


def cross_entropy(scores, labels, reduction, ignore_index=None):
    logp = np.log(softmax(scores, 1))
    keep = np.ones(len(labels), bool) if ignore_index is None else labels != ignore_index
    per_row = np.array([-logp[i, labels[i]] if keep[i] else 0.0 for i in range(len(labels))])
    if reduction == "none":
        return per_row
    return per_row.sum() if reduction == "sum" else per_row.sum() / keep.sum()


# ---------------------------------------------------------------- activation gradients

def test_relu_grad(rng):
    x = rng.uniform(0.1, 2, (4, 5)) * rng.choice([-1, 1], (4, 5))  # away from the kink at 0
    dy = rng.normal(size=x.shape)
    want = numeric_grad(lambda v: np.sum(np.maximum(v, 0) * dy), x.copy())
    np.testing.assert_allclose(run("ReluGrad", dy, x), want, atol=1e-8)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_grad(rng, approximate):
    x = rng.uniform(-4, 4, (3, 7))
    dy = rng.normal(size=x.shape)
    want = numeric_grad(lambda v: np.sum(gelu(v, approximate) * dy), x.copy())
    np.testing.assert_allclose(run("GeluGrad", dy, x, approximate=approximate), want, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_grad(rng, axis):
    x = rng.normal(size=(3, 4, 5))
    dy = rng.normal(size=x.shape)
    want = numeric_grad(lambda v: np.sum(softmax(v, axis) * dy), x.copy())
    np.testing.assert_allclose(run("SoftmaxGrad", dy, softmax(x, axis), axis=axis), want, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", [F16, BFLOAT16, F32], ids=str)
def test_activation_grads_low_precision(rng, dtype):
    x64 = rng.uniform(-3, 3, (4, 6))
    dy64 = rng.normal(size=x64.shape)
    x, dy = x64.astype(dtype), dy64.astype(dtype)
    tol = {F16: 1e-2, BFLOAT16: 3e-2, F32: 1e-5}[dtype]
    for op, attrs in [("ReluGrad", {}), ("GeluGrad", {}), ("GeluGrad", {"approximate": "tanh"})]:
        got = run(op, dy, x, **attrs)
        want = run(op, dy.astype(F64), x.astype(F64), **attrs)  # f64 kernel: checked above by FD
        assert got.dtype == dtype
        np.testing.assert_allclose(got.astype(F64), want, rtol=tol, atol=tol)
    y = softmax(x.astype(F64), -1).astype(dtype)
    got = run("SoftmaxGrad", dy, y)
    assert got.dtype == dtype
    np.testing.assert_allclose(got.astype(F64), run("SoftmaxGrad", dy.astype(F64), y.astype(F64)), atol=tol)


def test_activation_grad_errors():
    expect_error(INVALID, "ReluGrad: X has shape (3,) but dY has (2,)", registry.infer, "ReluGrad",
                 [TensorSpec((2,), F32), TensorSpec((3,), F32)], {})
    expect_error(UNSUPPORTED, "dY is float32 but X is float16", registry.infer, "GeluGrad",
                 [TensorSpec((2,), F32), TensorSpec((2,), F16)], {})
    expect_error(INVALID, "approximate", registry.infer, "GeluGrad",
                 [TensorSpec((2,), F32), TensorSpec((2,), F32)], {"approximate": "fast"})
    expect_error(INVALID, "axis 3", registry.infer, "SoftmaxGrad",
                 [TensorSpec((2, 2), F32), TensorSpec((2, 2), F32)], {"axis": 3})
    (spec,) = registry.infer("ReluGrad", [TensorSpec((-1, 4), F32), TensorSpec((3, -1), F32)], {})
    assert spec.shape == (3, 4)


# ---------------------------------------------------------------- LayerNormalizationGrad

@pytest.mark.parametrize("axis,scale_shape", [(-1, (5,)), (1, (4, 5)), (1, (5,)), (-2, (1, 5))])
def test_layer_norm_grad(rng, axis, scale_shape):
    x = rng.normal(size=(3, 4, 5))
    scale, bias = rng.uniform(0.5, 1.5, scale_shape), rng.normal(size=scale_shape)
    dy = rng.normal(size=x.shape)
    _, mean, inv = layer_norm(x, scale, bias, axis)
    dx, dscale, dbias = run("LayerNormalizationGrad", dy, x, scale, mean, inv, axis=axis)

    def loss(x_=x, scale_=scale, bias_=bias):
        return np.sum(layer_norm(x_, scale_, bias_, axis)[0] * dy)

    np.testing.assert_allclose(dx, numeric_grad(lambda v: loss(x_=v), x.copy()), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dscale, numeric_grad(lambda v: loss(scale_=v), scale.copy()), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dbias, numeric_grad(lambda v: loss(bias_=v), bias.copy()), rtol=1e-5, atol=1e-7)
    assert dscale.shape == dbias.shape == scale_shape


def test_layer_norm_grad_chains_with_forward_kernel_in_fp32(rng):
    x = rng.normal(size=(6, 8)).astype(F32)
    scale = rng.uniform(0.5, 1.5, 8).astype(F32)
    dy = rng.normal(size=x.shape).astype(F32)
    _, mean, inv = run("LayerNormalization", x, scale)
    dx, dscale, dbias = run("LayerNormalizationGrad", dy, x, scale, mean, inv)
    want = run("LayerNormalizationGrad", dy.astype(F64), x.astype(F64), scale.astype(F64),
               *layer_norm(x.astype(F64), scale.astype(F64), 0.0, -1)[1:])
    for got, ref in zip((dx, dscale, dbias), want):
        assert got.dtype == F32
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_layer_norm_grad_errors():
    def specs(stat_shape=(2, 1), stat_dtype=F32, x_dtype=F32):
        return [TensorSpec((2, 4), F32), TensorSpec((2, 4), x_dtype), TensorSpec((4,), F32),
                TensorSpec(stat_shape, stat_dtype), TensorSpec((2, 1), F32)]
    expect_error(INVALID, "Mean has shape (2, 4)", registry.infer, "LayerNormalizationGrad", specs((2, 4)), {})
    expect_error(INVALID, "Mean has dtype float64, expected float32", registry.infer, "LayerNormalizationGrad",
                 specs(stat_dtype=F64), {})
    expect_error(UNSUPPORTED, "dY is float32 but X is float16", registry.infer, "LayerNormalizationGrad",
                 specs(x_dtype=F16), {})
    out = registry.infer("LayerNormalizationGrad", specs(stat_shape=(-1, 1)), {})
    assert [s.shape for s in out] == [(2, 4), (4,), (4,)]


# ---------------------------------------------------------------- SoftmaxCrossEntropyLoss (+ Grad)

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [None, 2])
def test_cross_entropy_loss_and_grad(rng, reduction, ignore_index):
    scores = rng.normal(size=(6, 4)) * 3
    labels = np.array([0, 2, 3, 1, 2, 3], np.int64)
    attrs = {"reduction": reduction} | ({} if ignore_index is None else {"ignore_index": ignore_index})
    loss, log_prob = run("SoftmaxCrossEntropyLoss", scores, labels, **attrs)
    np.testing.assert_allclose(loss, cross_entropy(scores, labels, reduction, ignore_index), rtol=1e-12)
    np.testing.assert_allclose(log_prob, np.log(softmax(scores, 1)), rtol=1e-12)
    assert loss.shape == ((6,) if reduction == "none" else ())

    dloss = rng.normal(size=loss.shape)
    got = run("SoftmaxCrossEntropyLossGrad", dloss, log_prob, labels.astype(np.int32), **attrs)
    want = numeric_grad(lambda v: np.sum(cross_entropy(v, labels, reduction, ignore_index) * dloss), scores.copy())
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", [F16, BFLOAT16, F32], ids=str)
def test_cross_entropy_low_precision(rng, dtype):
    scores = (rng.normal(size=(5, 3)) * 2).astype(dtype)
    labels = np.array([0, 1, 2, 1, 0], np.int32)
    tol = {F16: 1e-2, BFLOAT16: 3e-2, F32: 1e-5}[dtype]
    loss, log_prob = run("SoftmaxCrossEntropyLoss", scores, labels)
    assert loss.dtype == log_prob.dtype == dtype
    np.testing.assert_allclose(float(loss), cross_entropy(scores.astype(F64), labels, "mean"), rtol=tol)
    grad = run("SoftmaxCrossEntropyLossGrad", np.array(1.0, dtype), log_prob, labels)
    want = (softmax(scores.astype(F64), 1) - np.eye(3)[labels]) / 5
    np.testing.assert_allclose(grad.astype(F64), want, atol=tol)


def test_cross_entropy_errors():
    scores, labels = np.zeros((3, 4)), np.array([0, 4, 1])
    expect_error(INVALID, "label 4 at position 1 is out of range for 4 classes", run,
                 "SoftmaxCrossEntropyLoss", scores, labels)
    expect_error(INVALID, "label -1 at position 1", run, "SoftmaxCrossEntropyLoss", scores, np.array([0, -1, 1]))
    run("SoftmaxCrossEntropyLoss", scores, np.array([0, -100, 1]), ignore_index=-100)  # ignored: fine
    expect_error(INVALID, "label 4", run, "SoftmaxCrossEntropyLossGrad", np.array(1.0), scores, labels)
    infer = registry.infer
    expect_error(INVALID, "expected scores [N, C] and labels [N]", infer, "SoftmaxCrossEntropyLoss",
                 [TensorSpec((3, 4, 2), F32), TensorSpec((3,), np.int64)], {})
    expect_error(UNSUPPORTED, "labels has dtype float32", infer, "SoftmaxCrossEntropyLoss",
                 [TensorSpec((3, 4), F32), TensorSpec((3,), F32)], {})
    expect_error(INVALID, "labels has shape (2,)", infer, "SoftmaxCrossEntropyLoss",
                 [TensorSpec((3, 4), F32), TensorSpec((2,), np.int64)], {})
    expect_error(INVALID, "reduction='avg'", infer, "SoftmaxCrossEntropyLoss",
                 [TensorSpec((3, 4), F32), TensorSpec((3,), np.int64)], {"reduction": "avg"})
    expect_error(INVALID, "dloss has shape (3,)", infer, "SoftmaxCrossEntropyLossGrad",
                 [TensorSpec((3,), F32), TensorSpec((3, 4), F32), TensorSpec((3,), np.int64)], {})
    loss, log_prob = infer("SoftmaxCrossEntropyLoss", [TensorSpec((-1, 4), F32), TensorSpec((-1,), np.int64)],
                           {"reduction": "none"})
    assert (loss.shape, log_prob.shape) == ((-1,), (-1, 4))


# ---------------------------------------------------------------- optimizers vs torch.optim formulas

def torch_sgd(param, grads, lr, momentum, weight_decay, nesterov):
    """torch.optim.SGD (dampening=0) written out per element, as in its documentation."""
    param, buf = param.copy(), None
    for g in grads:
        g = g + weight_decay * param
        buf = g.copy() if buf is None else momentum * buf + g  # torch: buf = clone(g) on the first step
        g = g + momentum * buf if nesterov else buf
        param = param - lr * g
    return param, buf


def torch_adam(param, grads, lr, beta1, beta2, eps, weight_decay, decoupled):
    """torch.optim.Adam / AdamW per the documented algorithm (amsgrad=False, maximize=False)."""
    param = param.copy()
    m, v = np.zeros_like(param), np.zeros_like(param)
    for t, g in enumerate(grads, start=1):
        if decoupled:
            param = param - lr * weight_decay * param
        else:
            g = g + weight_decay * param
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
        param = param - lr * m_hat / (np.sqrt(v_hat) + eps)
    return param, m, v


@pytest.mark.parametrize("momentum,weight_decay,nesterov", [(0.9, 0.0, False), (0.5, 0.1, False),
                                                            (0.9, 0.01, True), (0.0, 0.0, False)])
def test_sgd_momentum_three_steps(rng, momentum, weight_decay, nesterov):
    param0 = rng.normal(size=(3, 4))
    grads = [rng.normal(size=(3, 4)) for _ in range(3)]
    param, velocity = param0.copy(), np.zeros_like(param0)
    attrs = {"lr": 0.1, "momentum": momentum, "weight_decay": weight_decay, "nesterov": nesterov}
    for g in grads:
        assert registry.infer("SGDMomentum", [TensorSpec(a.shape, a.dtype) for a in (param, g, velocity)],
                              attrs) == []
        registry.get_op("SGDMomentum").compute([param, g, velocity], [], attrs)
    want_param, want_buf = torch_sgd(param0, grads, 0.1, momentum, weight_decay, nesterov)
    np.testing.assert_allclose(param, want_param, rtol=1e-12)
    np.testing.assert_allclose(velocity, want_buf, rtol=1e-12)


@pytest.mark.parametrize("decoupled,weight_decay", [(False, 0.0), (False, 0.1), (True, 0.1), (True, 0.0)])
def test_adam_three_steps(rng, decoupled, weight_decay):
    param0 = rng.normal(size=(5,))
    grads = [rng.normal(size=(5,)) for _ in range(3)]
    param, m, v = param0.copy(), np.zeros(5), np.zeros(5)
    for step, g in enumerate(grads, start=1):
        registry.get_op("Adam").compute([param, g, m, v], [], {
            "lr": 0.01, "beta1": 0.8, "beta2": 0.95, "epsilon": 1e-6, "weight_decay": weight_decay,
            "step": step, "decoupled": decoupled})
    want = torch_adam(param0, grads, 0.01, 0.8, 0.95, 1e-6, weight_decay, decoupled)
    for got, ref in zip((param, m, v), want):
        np.testing.assert_allclose(got, ref, rtol=1e-12)


def test_adam_by_hand_first_step():
    # Step 1 with bias correction: m̂ = g and v̂ = g², so the step is lr·g/(|g| + eps) ≈ lr·sign(g).
    param, g, m, v = np.array([1.0, -2.0]), np.array([0.5, -4.0]), np.zeros(2), np.zeros(2)
    registry.get_op("Adam").compute([param, g, m, v], [], {"lr": 0.1, "step": 1})
    np.testing.assert_allclose(param, [1.0 - 0.1 * 0.5 / (0.5 + 1e-8), -2.0 + 0.1 * 4.0 / (4.0 + 1e-8)])
    np.testing.assert_allclose(m, [0.05, -0.4])
    np.testing.assert_allclose(v, [0.00025, 0.016])


@pytest.mark.parametrize("dtype", [F16, BFLOAT16, F32], ids=str)
def test_optimizers_low_precision(rng, dtype):
    p64, g64 = rng.normal(size=8), rng.normal(size=8)
    tol = {F16: 2e-3, BFLOAT16: 1.6e-2, F32: 1e-6}[dtype]
    p, g, vel = p64.astype(dtype), g64.astype(dtype), np.zeros(8, dtype)
    registry.get_op("SGDMomentum").compute([p, g, vel], [], {"lr": 0.1})
    assert p.dtype == dtype
    np.testing.assert_allclose(p.astype(F64), torch_sgd(p64, [g64], 0.1, 0.9, 0.0, False)[0], rtol=tol, atol=tol)
    p, m, v = p64.astype(dtype), np.zeros(8, dtype), np.zeros(8, dtype)
    registry.get_op("Adam").compute([p, g, m, v], [], {"lr": 0.1, "step": 1, "decoupled": True,
                                                       "weight_decay": 0.1})
    want = torch_adam(p64, [g64], 0.1, 0.9, 0.999, 1e-8, 0.1, True)[0]
    np.testing.assert_allclose(p.astype(F64), want, rtol=tol, atol=tol)


def test_optimizer_errors():
    sgd_specs = [TensorSpec((4,), F32)] * 3
    expect_error(INVALID, "'lr' is required", registry.infer, "SGDMomentum", sgd_specs, {})
    expect_error(INVALID, "lr=-0.1 (expected >= 0.0)", registry.infer, "SGDMomentum", sgd_specs, {"lr": -0.1})
    expect_error(INVALID, "nesterov=True needs momentum > 0", registry.infer, "SGDMomentum", sgd_specs,
                 {"lr": 0.1, "momentum": 0, "nesterov": True})
    expect_error(UNSUPPORTED, "param is float32 but velocity is float16", registry.infer, "SGDMomentum",
                 [TensorSpec((4,), F32), TensorSpec((4,), F32), TensorSpec((4,), F16)], {"lr": 0.1})
    expect_error(INVALID, "grad has shape (5,)", registry.infer, "SGDMomentum",
                 [TensorSpec((4,), F32), TensorSpec((5,), F32), TensorSpec((4,), F32)], {"lr": 0.1})
    expect_error(UNSUPPORTED, "param has dtype int32", registry.infer, "SGDMomentum",
                 [TensorSpec((4,), np.int32)] * 3, {"lr": 0.1})
    adam_specs = [TensorSpec((4,), F32)] * 4
    expect_error(INVALID, "'step' is required", registry.infer, "Adam", adam_specs, {"lr": 0.1})
    expect_error(INVALID, "step=0", registry.infer, "Adam", adam_specs, {"lr": 0.1, "step": 0})
    expect_error(INVALID, "beta2=1.0 (expected >= 0.0 and < 1.0)", registry.infer, "Adam", adam_specs,
                 {"lr": 0.1, "step": 1, "beta2": 1.0})
    expect_error(INVALID, "amsgrad", registry.infer, "Adam", adam_specs, {"lr": 0.1, "step": 1, "amsgrad": True})
    op = registry.get_op("Adam")
    assert op.inplace == (0, 2, 3) and registry.get_op("SGDMomentum").inplace == (0, 2)
