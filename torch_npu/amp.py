"""``torch.npu.amp``: ``autocast``, ``GradScaler``, ``custom_fwd`` / ``custom_bwd``, and the autocast policy for
``npu`` tensors.

``torch.autocast("npu")`` is torch's own autocast for the PrivateUse1 device (named ``npu``); torch ships no
autocast kernels for it, so this module registers them — the op lists torch uses for CUDA (matmul-like ops in
the autocast dtype, numerically sensitive ops in float32, a few ops promoted to the widest input type) — on the
``AutocastPrivateUse1`` dispatch key, with a fallthrough for every other op (torch registers none for this
key, so without it any op under ``autocast("npu")`` would fail). They apply to ``npu`` tensors (PrivateUse1,
``backend.py``), whatever ran them; CPU tensors follow CPU autocast, as in torch.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.amp.grad_scaler import _refresh_per_optimizer_state

from ._error_code import ErrCode, pta_error

LOWER_PRECISION = ("_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
                   "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm",
                   "mv", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "lstm_cell",
                   "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "scaled_dot_product_attention")
FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
        "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm",
        "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
        "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
        "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
        "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
        "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm", "linalg_matrix_norm", "norm", "sum",
        "prod", "cross_entropy_loss")
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put", "scatter_add",
           "tensordot")

_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_lib = None


def _eligible(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.device.type == "npu" \
        and t.dtype is not torch.float64


def _cast(value, dtype):
    if _eligible(value):
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _widest(values):
    """The widest floating dtype among the eligible tensors (``promote`` ops), None if there are none."""
    best = None
    for v in values:
        for t in (v if isinstance(v, (list, tuple)) else (v,)):
            if _eligible(t):
                best = t.dtype if best is None else torch.promote_types(best, t.dtype)
    return best


def _kernel(op, policy):
    def run(*args, **kwargs):
        if policy == "lower":
            dtype = torch.get_autocast_dtype("npu")
        elif policy == "fp32":
            dtype = torch.float32
        else:
            dtype = _widest(list(args) + list(kwargs.values()))
        if dtype is not None:
            args = tuple(_cast(a, dtype) for a in args)
            kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)
    return run


def register_autocast_kernels() -> None:
    """Register the autocast policy on ``AutocastPrivateUse1`` (once per process)."""
    global _lib
    if _lib is not None:
        return
    fallthrough = torch.library.Library("_", "IMPL")       # torch registers none for PrivateUse1's autocast key:
    fallthrough.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")   # other ops pass through
    lib = torch.library.Library("aten", "IMPL")
    for policy, names in (("lower", LOWER_PRECISION), ("fp32", FP32), ("promote", PROMOTE)):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                if "out" in overload or overload.endswith("_"):
                    continue
                qualified = name if overload == "default" else f"{name}.{overload}"
                try:
                    if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{qualified}", "AutocastPrivateUse1"):
                        continue
                except RuntimeError:                 # an overload only Python knows (einsum.sublist): no schema
                    continue
                lib.impl(qualified, _kernel(getattr(packet, overload), policy), "AutocastPrivateUse1")
    _lib = (fallthrough, lib)


class autocast(torch.amp.autocast_mode.autocast):
    """``torch.npu.amp.autocast(enabled=True, dtype=torch.float16, cache_enabled=True)`` is
    ``torch.autocast("npu", ...)``."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        super().__init__("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


def custom_fwd(fwd=None, *, cast_inputs=None):
    """``torch.amp.custom_fwd(..., device_type="npu")``."""
    return torch.amp.custom_fwd(fwd, device_type="npu", cast_inputs=cast_inputs)


def custom_bwd(bwd):
    """``torch.amp.custom_bwd(..., device_type="npu")``."""
    return torch.amp.custom_bwd(bwd, device_type="npu")


class GradScaler(torch.amp.GradScaler):
    """torch_npu's ``GradScaler(init_scale=2.**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
    dynamic=True, enabled=True)``: torch's scaler on ``npu``; ``dynamic=False`` keeps the scale fixed (steps
    with inf/NaN gradients are still skipped)."""

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 dynamic=True, enabled=True):
        if enabled:
            if growth_factor <= 1.0:
                raise ValueError("The growth factor must be > 1.0." + pta_error(ErrCode.VALUE))
            if backoff_factor >= 1.0:
                raise ValueError("The backoff factor must be < 1.0." + pta_error(ErrCode.VALUE))
        super().__init__("npu", init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=enabled)
        self._dynamic = dynamic

    def update(self, new_scale=None) -> None:
        if not self._enabled:
            return
        if self._dynamic or new_scale is not None:
            super().update(new_scale)
            return
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)


def get_amp_supported_dtype():
    """What ``torch.autocast("npu")`` accepts (torch asks the device module)."""
    return [torch.float16, torch.bfloat16, torch.float32]


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("npu")


def set_autocast_enabled(enable: bool) -> None:
    torch.set_autocast_enabled("npu", bool(enable))


def get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype("npu")


def set_autocast_dtype(dtype: torch.dtype) -> None:
    torch.set_autocast_dtype("npu", dtype)


__all__ = ["GradScaler", "autocast", "custom_bwd", "custom_fwd"]
