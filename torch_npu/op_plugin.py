"""torch_npu's operators in the ``npu`` namespace of torch's dispatcher: ``torch.ops.npu.npu_rms_norm(x, gamma)``,
``torch.ops.npu.npu_format_cast(t, 29)``, ... as op-plugin registers them (its schemas, overloads included), and
``torch_npu.npu_rms_norm`` ... are those ops.

Each op has kernels for the ``npu`` device only — ``PrivateUse1`` and its autograd key — as on torch_npu, so a
CPU tensor is refused by the dispatcher with torch's own ``NotImplementedError: Could not run
'npu::npu_rms_norm' with arguments from the 'CPU' backend...``. The kernels are the compositions of ``ops.py`` and
``formats.py``; the one at the autograd key runs them with autograd on, so torch differentiates every op through
its composition (gradients match the same composition on CPU).
"""

from __future__ import annotations

import torch

from . import formats, ops

# op-plugin's schemas (op_plugin_functions.yaml, and torch_npu's npu_native_functions.yaml for the formats)
SCHEMAS = {
    "npu_rms_norm": "npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
    "npu_add_rms_norm": "npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> "
                        "(Tensor, Tensor, Tensor)",
    "npu_rotary_mul": "npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', "
                      "Tensor? rotate=None) -> Tensor",
    "npu_apply_rotary_pos_emb": "npu_apply_rotary_pos_emb(Tensor query, Tensor key, Tensor cos, Tensor sin, "
                                "str layout='BSND', str rotary_mode='half') -> (Tensor, Tensor)",
    "npu_swiglu": "npu_swiglu(Tensor self, int dim=-1) -> Tensor",
    "npu_fusion_attention": (
        "npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, "
        "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., float keep_prob=1., "
        "int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, int[]? prefix=None, "
        "int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, "
        "bool gen_mask_parallel=True, bool sync=False, str softmax_layout=\"\", Tensor? sink=None, "
        "Tensor? dropout_mask=None, int seed=0, int offset=0) -> (Tensor, Tensor, Tensor, Tensor, int, int, int)"),
    "npu_fast_gelu": "npu_fast_gelu(Tensor self) -> Tensor",
    "fast_gelu": "fast_gelu(Tensor self) -> Tensor",
    "npu_gelu": "npu_gelu(Tensor self, *, str approximate='none') -> Tensor",
    "npu_silu": "npu_silu(Tensor self) -> Tensor",
    "npu_confusion_transpose": "npu_confusion_transpose(Tensor self, int[] perm, int[] shape, bool transpose_first) "
                               "-> Tensor",
    "get_npu_format": "get_npu_format(Tensor self) -> int",
    "npu_format_cast": "npu_format_cast(Tensor self, int acl_format, *, int? customize_dtype=None, "
                       "int? input_dtype=None) -> Tensor",
    "npu_format_cast.Tensor": "npu_format_cast.Tensor(Tensor self, Tensor dst, *, int? customize_dtype=None, "
                              "int? input_dtype=None) -> Tensor",
    "npu_format_cast_.acl_format": "npu_format_cast_.acl_format(Tensor(a!) self, int acl_format, *, "
                                   "int? customize_dtype=None, int? input_dtype=None) -> Tensor(a!)",
    "npu_format_cast_": "npu_format_cast_(Tensor(a!) self, Tensor src, *, int? customize_dtype=None, "
                        "int? input_dtype=None) -> Tensor(a!)",
}

KERNELS = {
    "npu_rms_norm": ops.npu_rms_norm, "npu_add_rms_norm": ops.npu_add_rms_norm,
    "npu_rotary_mul": ops.npu_rotary_mul, "npu_apply_rotary_pos_emb": ops.npu_apply_rotary_pos_emb,
    "npu_swiglu": ops.npu_swiglu, "npu_fusion_attention": ops.npu_fusion_attention,
    "npu_fast_gelu": ops.npu_fast_gelu, "fast_gelu": ops.npu_fast_gelu, "npu_gelu": ops.npu_gelu,
    "npu_silu": ops.npu_silu, "npu_confusion_transpose": ops.npu_confusion_transpose,
    "get_npu_format": formats.get_npu_format, "npu_format_cast": formats.npu_format_cast,
    "npu_format_cast.Tensor": formats.npu_format_cast, "npu_format_cast_.acl_format": formats.npu_format_cast_,
    "npu_format_cast_": formats.npu_format_cast_,
}

_library: torch.library.Library | None = None


def register() -> None:
    """Define the ``npu`` ops and register their kernels for the npu device (once per process)."""
    global _library
    if _library is not None:
        return
    lib = torch.library.Library("npu", "FRAGMENT")
    for name, schema in SCHEMAS.items():
        lib.define(schema)
        for key in ("PrivateUse1", "AutogradPrivateUse1"):
            lib.impl(name, KERNELS[name], key)
    _library = lib


register()

# torch_npu's top-level functions are the ops themselves (as its generated bindings dispatch to them)
npu_rms_norm = torch.ops.npu.npu_rms_norm
npu_add_rms_norm = torch.ops.npu.npu_add_rms_norm
npu_rotary_mul = torch.ops.npu.npu_rotary_mul
npu_apply_rotary_pos_emb = torch.ops.npu.npu_apply_rotary_pos_emb
npu_swiglu = torch.ops.npu.npu_swiglu
npu_fusion_attention = torch.ops.npu.npu_fusion_attention
npu_fast_gelu = torch.ops.npu.npu_fast_gelu
fast_gelu = torch.ops.npu.fast_gelu
npu_gelu = torch.ops.npu.npu_gelu
npu_silu = torch.ops.npu.npu_silu
npu_confusion_transpose = torch.ops.npu.npu_confusion_transpose
npu_format_cast = torch.ops.npu.npu_format_cast
npu_format_cast_ = torch.ops.npu.npu_format_cast_


def get_npu_format(tensor: torch.Tensor) -> formats.Format:
    """``torch.ops.npu.get_npu_format`` as a ``torch_npu.Format`` (an int enum)."""
    return formats.Format(torch.ops.npu.get_npu_format(tensor))


__all__ = ["fast_gelu", "get_npu_format", "npu_add_rms_norm", "npu_apply_rotary_pos_emb", "npu_confusion_transpose",
           "npu_fast_gelu", "npu_format_cast", "npu_format_cast_", "npu_fusion_attention", "npu_gelu",
           "npu_rms_norm", "npu_rotary_mul", "npu_silu", "npu_swiglu"]
