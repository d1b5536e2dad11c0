"""ATen operators torch calls only on an accelerator, which CPU torch has no kernel for, as ``npu`` kernels.

torch's RNN cells take the fused path for a PrivateUse1 tensor (``_thnn_fused_lstm_cell``, ``_thnn_fused_gru_cell``
and their backward), and ``nn.SyncBatchNorm`` is built on ``batch_norm_stats``, ``batch_norm_gather_stats(_with_counts)``,
``batch_norm_elemt``, ``batch_norm_backward_reduce`` and ``batch_norm_backward_elemt``: CUDA (and torch_npu) kernels
only, so the fallback's CPU kernel does not exist. Each is written here as torch CPU operations on the arguments' CPU
views (``backend.cpu_kernel``): the math of torch's CUDA kernels, in the accumulate dtype (float32 for half and
bfloat16 inputs), with the same results and workspace contents, so torch's own autograd formulas for these operators
(derivatives.yaml) apply unchanged — and LSTM/GRU on ``npu`` match CPU torch's unfused cells.
"""

from __future__ import annotations

import torch

from . import backend

aten = torch.ops.aten


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# --- RNN cells ------------------------------------------------------------------------------------------------------

def _gates(input_gates, hidden_gates, input_bias, hidden_bias):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    return gates


def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """``(hy, cy, workspace)``; the workspace is the activated gates ``[i, f, g, o]`` (``[batch, 4 * hidden]``)."""
    i, f, g, o = _gates(input_gates, hidden_gates, input_bias, hidden_bias).chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, g, o], 1)


def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """``(grad_gates, grad_cx, grad_bias)``: the gradient of the pre-activation gates (input and hidden gates get
    the same), of ``cx``, and of each bias (the gates' sum over the batch; undefined without biases)."""
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    grad_hy = torch.zeros_like(cy) if grad_hy is None else grad_hy
    grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy)
    if grad_cy is not None:
        grad_c = grad_c + grad_cy
    grad_gates = torch.cat([grad_c * g * i * (1 - i),
                            grad_c * cx * f * (1 - f),
                            grad_c * i * (1 - g * g),
                            grad_hy * tanh_cy * o * (1 - o)], 1)
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, grad_c * f, grad_bias


def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """``(hy, workspace)``; the workspace holds ``[r, z, n, hx, hidden n gate]`` (``[batch, 5 * hidden]``)."""
    if input_bias is not None:
        input_gates = input_gates + input_bias
        hidden_gates = hidden_gates + hidden_bias
    ir, iz, in_ = input_gates.chunk(3, 1)
    hr, hz, hn = hidden_gates.chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + z * (hx - n)
    return hy, torch.cat([r, z, n, hx, hn], 1)


def gru_cell_backward(grad_hy, workspace, has_bias):
    """``(grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)``."""
    r, z, n, hx, hn = workspace.chunk(5, 1)
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_r = grad_n * hn * r * (1 - r)
    grad_input_gates = torch.cat([grad_r, grad_z, grad_n], 1)
    grad_hidden_gates = torch.cat([grad_r, grad_z, grad_n * r], 1)
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hy * z, None, None
    return grad_input_gates, grad_hidden_gates, grad_hy * z, grad_input_gates.sum(0), grad_hidden_gates.sum(0)


# --- SyncBatchNorm --------------------------------------------------------------------------------------------------

def _reduce_dims(x: torch.Tensor) -> list:
    """Every dimension but the channels (dim 1)."""
    return [0, *range(2, x.dim())]


def _per_channel(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A ``[C]`` vector shaped to broadcast over ``like``'s channel dimension."""
    return v.reshape(1, -1, *([1] * (like.dim() - 2)))


def batch_norm_stats(input, eps):
    """This process's ``(mean, invstd)`` per channel: ``invstd = 1 / sqrt(biased var + eps)``."""
    x = input.to(_acc_dtype(input.dtype))
    var, mean = torch.var_mean(x, _reduce_dims(x), correction=0)
    return mean, (var + eps).rsqrt()


def batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts):
    """The global ``(mean, invstd)`` from every process's ``mean``, ``invstd`` (``[world, C]``) and element
    ``counts`` (``[world]``); ``running_mean``/``running_var`` move towards the global mean and unbiased variance."""
    counts = counts.to(mean.dtype).reshape(-1, 1)
    total = counts.sum()
    global_mean = (counts * mean).sum(0) / total
    var = invstd.reciprocal().square() - eps                 # each process's biased variance
    var_sum = (counts * (var + (mean - global_mean).square())).sum(0)
    if running_mean is not None:
        running_mean.mul_(1 - momentum).add_(global_mean.to(running_mean.dtype), alpha=momentum)
    if running_var is not None:
        unbiased = var_sum / (total - 1)
        running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
    return global_mean, (var_sum / total + eps).rsqrt()


def batch_norm_gather_stats(input, mean, invstd, running_mean, running_var, momentum, eps, count):
    counts = torch.full((mean.shape[0],), count, dtype=mean.dtype)
    return batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts)


def batch_norm_elemt(input, weight, bias, mean, invstd, eps):
    """``(input - mean) * invstd * weight + bias`` over the channel dimension, in ``input``'s dtype."""
    acc = _acc_dtype(input.dtype)
    scale = invstd.to(acc) if weight is None else invstd.to(acc) * weight.to(acc)
    shift = -mean.to(acc) * scale
    if bias is not None:
        shift = shift + bias.to(acc)
    out = input.to(acc) * _per_channel(scale, input) + _per_channel(shift, input)
    return out.to(input.dtype)


def batch_norm_elemt_out(input, weight, bias, mean, invstd, eps, *, out):
    result = batch_norm_elemt(input, weight, bias, mean, invstd, eps)
    out.resize_(result.shape)
    return out.copy_(result)


def batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g):
    """``(sum_dy, sum_dy_xmu, grad_weight, grad_bias)`` of this process, each undefined unless asked for."""
    acc = mean.dtype
    dims = _reduce_dims(input)
    dy = grad_out.to(acc)
    sum_dy = dy.sum(dims)
    sum_dy_xmu = (dy * (input.to(acc) - _per_channel(mean, input))).sum(dims)
    like = weight if weight is not None else mean
    grad_weight = (sum_dy_xmu * invstd).to(like.dtype) if weight_g else None
    grad_bias = sum_dy.to(like.dtype) if bias_g else None
    if not input_g:
        sum_dy = sum_dy_xmu = None
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


def batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    """The input gradient from the global ``sum_dy``, ``sum_dy_xmu`` and every process's element ``count``."""
    acc = mean.dtype
    total = count.to(acc).sum()
    mean_dy = _per_channel(sum_dy / total, input)
    mean_dy_xmu = _per_channel(sum_dy_xmu / total, input)
    scale = invstd if weight is None else invstd * weight.to(acc)
    xmu = input.to(acc) - _per_channel(mean, input)
    inv = _per_channel(invstd, input)
    grad = (grad_out.to(acc) - mean_dy - xmu * inv * inv * mean_dy_xmu) * _per_channel(scale, input)
    return grad.to(input.dtype)


KERNELS = {
    aten._thnn_fused_lstm_cell.default: lstm_cell,
    aten._thnn_fused_lstm_cell_backward_impl.default: lstm_cell_backward,
    aten._thnn_fused_gru_cell.default: gru_cell,
    aten._thnn_fused_gru_cell_backward.default: gru_cell_backward,
    aten.batch_norm_stats.default: batch_norm_stats,
    aten.batch_norm_gather_stats.default: batch_norm_gather_stats,
    aten.batch_norm_gather_stats_with_counts.default: batch_norm_gather_stats_with_counts,
    aten.batch_norm_elemt.default: batch_norm_elemt,
    aten.batch_norm_elemt.out: batch_norm_elemt_out,
    aten.batch_norm_backward_reduce.default: batch_norm_backward_reduce,
    aten.batch_norm_backward_elemt.default: batch_norm_backward_elemt,
}


def register(library: torch.library.Library) -> None:
    """Register the kernels above for PrivateUse1 in ``library`` (an ``aten`` IMPL library)."""
    for op, impl in KERNELS.items():
        name = op._schema.name.split("::", 1)[1]
        if op._overloadname != "default":
            name = f"{name}.{op._overloadname}"
        library.impl(name, backend.cpu_kernel(op, impl), "PrivateUse1")
