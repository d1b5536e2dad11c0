"""Reference implementations of the torch_npu fused operators distributed model code calls most.

Each takes torch_npu's arguments (names, defaults, order) and returns what it returns (shapes, dtypes, tuple
arity), computed as a composition of torch ops — in float32 where the fused kernel accumulates in float32
(norms, RoPE, SwiGLU, attention, FastGelu), cast back to the input dtype. These are the kernels ``op_plugin.py``
registers as ``torch.ops.npu.*`` for npu tensors: being plain torch, autograd differentiates them (the
``*_backward`` kernels are not needed). Argument errors are ``RuntimeError`` (op-plugin's texts where it has one).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._error_code import ErrCode, ops_error

MAX_TOKENS = 2147483647


def _fail(message: str):
    raise RuntimeError(message + ops_error(ErrCode.PARAM))


# ------------------------------------------------------------------ norms and activations
def npu_rms_norm(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06):
    """RMSNorm over ``gamma``'s trailing dims: ``(x / sqrt(mean(x^2) + eps) * gamma, rstd)``; ``rstd`` is float32
    with ``self``'s leading dims and 1 for each normalized dim."""
    n = gamma.dim()
    if n > self.dim() or tuple(self.shape[self.dim() - n:]) != tuple(gamma.shape):
        _fail(f"npu_rms_norm: gamma's shape {tuple(gamma.shape)} must equal the trailing dims of self's shape "
              f"{tuple(self.shape)}")
    dims = tuple(range(self.dim() - n, self.dim()))
    x = self.float()
    rstd = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return (x * rstd * gamma.float()).to(self.dtype), rstd


def npu_add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06):
    """``x = x1 + x2``, then RMSNorm: ``(y, rstd, x)``."""
    x = x1 + x2
    y, rstd = npu_rms_norm(x, gamma, epsilon)
    return y, rstd, x


def npu_swiglu(self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``silu(A) * B`` with ``A, B`` the two halves of ``self`` along ``dim``."""
    if not -self.dim() <= dim < self.dim():
        _fail(f"npu_swiglu: dim {dim} is out of range for a {self.dim()}-dimensional input")
    if self.shape[dim] % 2:
        _fail(f"npu_swiglu: the size of dim {dim} ({self.shape[dim]}) must be divisible by 2")
    a, b = self.float().chunk(2, dim=dim)
    return (F.silu(a) * b).to(self.dtype)


def npu_fast_gelu(self: torch.Tensor) -> torch.Tensor:
    """CANN's FastGelu: ``x / (1 + exp(-1.702|x|)) * exp(0.851 (x - |x|))``."""
    x = self.float()
    return (x / (1 + torch.exp(-1.702 * x.abs())) * torch.exp(0.851 * (x - x.abs()))).to(self.dtype)


fast_gelu = npu_fast_gelu


def npu_gelu(self: torch.Tensor, *, approximate: str = "none") -> torch.Tensor:
    return F.gelu(self, approximate=approximate)


def npu_silu(self: torch.Tensor) -> torch.Tensor:
    return F.silu(self)


def npu_confusion_transpose(self: torch.Tensor, perm, shape, transpose_first: bool) -> torch.Tensor:
    """Permute then reshape (``transpose_first``), or reshape then permute."""
    if transpose_first:
        return self.permute(*perm).reshape(*shape)
    return self.reshape(*shape).permute(*perm)


# ------------------------------------------------------------------ rotary embedding
def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate_interleave(x):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def npu_rotary_mul(self: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half",
                   rotate: torch.Tensor | None = None) -> torch.Tensor:
    """RoPE: ``x * r1 + rotate(x) * r2`` (``half``: ``cat(-x2, x1)``; ``interleave``: pairs; or ``x @ rotate``)."""
    if rotary_mode not in ("half", "interleave"):
        _fail(f"The rotary_mode of npu_rotary_mul should be half or interleave, but got {rotary_mode}")
    x = self.float()
    if rotate is not None:
        rotated = x @ rotate.float()
    elif rotary_mode == "half":
        rotated = _rotate_half(x)
    else:
        rotated = _rotate_interleave(x)
    return (x * r1.float() + rotated * r2.float()).to(self.dtype)


def npu_apply_rotary_pos_emb(query, key, cos, sin, layout: str = "BSND", rotary_mode: str = "half"):
    """RoPE on ``query`` and ``key`` in place (``cos``/``sin`` broadcast to them); returns ``(query, key)``."""
    if layout not in ("BSND", "BSH", "SBND", "BNSD", "TND"):
        _fail(f"npu_apply_rotary_pos_emb: unsupported layout {layout}")
    with torch.no_grad():
        query.copy_(npu_rotary_mul(query, cos, sin, rotary_mode))
        key.copy_(npu_rotary_mul(key, cos, sin, rotary_mode))
    return query, key


# ------------------------------------------------------------------ fused attention
def _to_bnsd(t: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "BSH":
        b, s, h = t.shape
        return t.reshape(b, s, heads, h // heads).transpose(1, 2)
    s, b, h = t.shape                                                        # SBH
    return t.reshape(s, b, heads, h // heads).permute(1, 2, 0, 3)


def _from_bnsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    b, n, s, d = t.shape
    if layout == "BSH":
        return t.transpose(1, 2).reshape(b, s, n * d)
    return t.permute(2, 0, 1, 3).reshape(s, b, n * d)                         # SBH


def _heads_of(t: torch.Tensor, layout: str, head_dim: int) -> int:
    """The head count of ``t`` in ``layout`` (BSH/SBH: hidden size over the query's head size)."""
    if layout == "BNSD":
        return t.shape[1]
    if layout == "BSND":
        return t.shape[2]
    return t.shape[2] // head_dim


def _sparse_mask(mode: int, s1: int, s2: int, pre: int, nxt: int, device) -> torch.Tensor | None:
    """The positions (True = masked) a sparse mode masks by itself: mode 0 outside the band ``-pre_tockens <=
    j - i <= next_tockens`` (anchored at the upper-left corner; only with an ``atten_mask``); modes 2, 3 and 4 the
    causal or band shape (the compressed mask passed for them is only the kernel's tile pattern)."""
    if mode == 1 or (mode == 0 and pre >= s1 + s2 and nxt >= s1 + s2):
        return None
    i = torch.arange(s1, device=device).unsqueeze(1)
    j = torch.arange(s2, device=device).unsqueeze(0)
    if mode == 0:
        return (j - i > nxt) | (i - j > pre)
    if mode == 2:                                             # leftUpCausal
        return j > i
    if mode == 3:                                             # rightDownCausal
        return j > i + (s2 - s1)
    if mode == 4:                                             # band, anchored at the lower-right corner
        rel = j - i - (s2 - s1)
        return (rel > nxt) | (rel < -pre)
    return None


def _attention(q, k, v, pse, mask, scale, keep_prob, mode, pre, nxt):
    """q [B,N1,S1,D], k/v [B,N2,S2,*] → (out [B,N1,S1,Dv], row max, row sum) in float32."""
    n1, n2 = q.shape[1], k.shape[1]
    if n2 != n1:
        if n2 == 0 or n1 % n2:
            _fail(f"npu_fusion_attention: the query's head number {n1} must be a multiple of the key's {n2}")
        k = k.repeat_interleave(n1 // n2, dim=1)
        v = v.repeat_interleave(n1 // n2, dim=1)
    scores = q.float() @ k.float().transpose(-1, -2)
    if pse is not None:
        scores = scores + pse.float()
    scores = scores * scale
    masked = None
    if mask is not None and mode in (0, 1):
        masked = mask.bool()
        while masked.dim() < 4:
            masked = masked.unsqueeze(0)
    if mode != 0 or mask is not None:
        shaped = _sparse_mask(mode, q.shape[2], k.shape[2], pre, nxt, q.device)
        if shaped is not None:
            masked = shaped if masked is None else masked | shaped
    if masked is not None:
        scores = scores.masked_fill(masked, torch.finfo(torch.float32).min)
    row_max = scores.amax(dim=-1)
    weights = torch.exp(scores - row_max.unsqueeze(-1))
    row_sum = weights.sum(dim=-1)
    probs = weights / row_sum.unsqueeze(-1)
    if keep_prob < 1:
        probs = F.dropout(probs, p=1 - keep_prob, training=True)
    return probs @ v.float(), row_max, row_sum


def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None,
                         scale=1.0, keep_prob=1.0, pre_tockens=MAX_TOKENS, next_tockens=MAX_TOKENS,
                         inner_precise=0, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                         gen_mask_parallel=True, sync=False, softmax_layout="", sink=None, dropout_mask=None, seed=0,
                         offset=0):
    """FlashAttentionScore: ``Dropout(Softmax(Mask(scale * (pse + Q K^T), atten_mask)), keep_prob) V``.

    Returns ``(attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels)``: the output in
    ``query``'s layout and dtype; the float32 row max and row sum of the softmax, ``[B, N1, S1, 8]`` (``[T, N1,
    8]`` for TND); an empty ``softmax_out``; the dropout seed/offset/element count (0 without dropout).
    ``atten_mask`` is True (1) where a score is masked. Layouts BSH, SBH, BSND, BNSD, TND (``actual_seq_qlen``/
    ``actual_seq_kvlen`` cumulative); GQA (fewer key heads); sparse modes 0-4 (0 masks ``atten_mask`` and, with a
    mask, outside the ``pre_tockens``/``next_tockens`` band; 2, 3, 4 build their mask from the shapes and the
    tokens; the prefix modes 5 and 6 are not simulated).
    """
    if head_num <= 0:
        _fail(f"head_num must > 0, but got {head_num}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() not in (3, 4):
            _fail(f"The shapes of the input {name} should be 3 or 4 dimensional, but got {t.dim()}-dimensional")
    if not 0 < keep_prob <= 1:
        _fail(f"The keep_prob value must be in range of (0, 1], but got {keep_prob}")
    layout = str(input_layout).upper()
    if layout not in ("BSH", "SBH", "BNSD", "BSND", "TND"):
        _fail(f"The input_layout should be BSH/SBH/BNSD/BSND/TND(case-insensitive), but got {input_layout}")
    if not 0 <= sparse_mode <= 6:
        _fail(f"The sparse_mode value must be in range of [0,6], but got {sparse_mode}")
    if sparse_mode in (5, 6) or prefix is not None:
        _fail("npu_fusion_attention: the prefix sparse modes (5, 6) are not simulated by npusim")
    if sink is not None or dropout_mask is not None:
        _fail("npu_fusion_attention: sink and a given dropout_mask are not simulated by npusim")
    if layout == "TND":
        return _fusion_attention_tnd(query, key, value, head_num, pse, atten_mask, scale, keep_prob, pre_tockens,
                                     next_tockens, actual_seq_qlen, actual_seq_kvlen, sparse_mode)
    d = query.shape[-1] // head_num if layout in ("BSH", "SBH") else query.shape[-1]
    q = _to_bnsd(query, layout, head_num)
    if layout in ("BSH", "SBH") and (d == 0 or query.shape[-1] % head_num or key.shape[-1] % d):
        _fail(f"npu_fusion_attention: hidden sizes {query.shape[-1]} (query) and {key.shape[-1]} (key) do not "
              f"split into heads of head_num={head_num}")
    k = _to_bnsd(key, layout, _heads_of(key, layout, d))
    v = _to_bnsd(value, layout, _heads_of(key, layout, d))
    out, row_max, row_sum = _attention(q, k, v, pse, atten_mask, scale, keep_prob, sparse_mode, pre_tockens,
                                       next_tockens)
    b, n, s1 = out.shape[:3]
    numels = b * n * s1 * k.shape[2] if keep_prob < 1 else 0
    seed = _dropout_seed() if keep_prob < 1 else 0
    return (_from_bnsd(out, layout).to(query.dtype), row_max.unsqueeze(-1).expand(b, n, s1, 8).contiguous(),
            row_sum.unsqueeze(-1).expand(b, n, s1, 8).contiguous(), query.new_empty([0]), seed, 0, numels)


def _dropout_seed() -> int:
    """The generator's seed as the schema's int (int64: torch's seeds are uint64)."""
    seed = torch.initial_seed()
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def _fusion_attention_tnd(query, key, value, head_num, pse, atten_mask, scale, keep_prob, pre, nxt, qlen, kvlen,
                          mode):
    """TND (varlen): each sequence of the batch attends within itself; lengths are cumulative ends (``pse`` is
    not taken in this layout)."""
    if pse is not None:
        _fail("npu_fusion_attention: pse with input_layout TND is not simulated by npusim")
    if not qlen or not kvlen or len(qlen) != len(kvlen):
        _fail("the size of actual_seq_qlen and actual_seq_kvlen must be the same and cannot be empty.")
    outs, maxes, sums = [], [], []
    q0 = k0 = 0
    for q1, k1 in zip(qlen, kvlen):
        q = query[q0:q1].transpose(0, 1).unsqueeze(0)
        k = key[k0:k1].transpose(0, 1).unsqueeze(0)
        v = value[k0:k1].transpose(0, 1).unsqueeze(0)
        mask = None if atten_mask is None or mode in (2, 3, 4) else atten_mask[..., :q1 - q0, :k1 - k0]
        out, row_max, row_sum = _attention(q, k, v, None, mask, scale, keep_prob, mode, pre, nxt)
        outs.append(out[0].transpose(0, 1))
        maxes.append(row_max[0].transpose(0, 1))
        sums.append(row_sum[0].transpose(0, 1))
        q0, k0 = q1, k1
    out, row_max, row_sum = torch.cat(outs), torch.cat(maxes), torch.cat(sums)
    t, n = row_max.shape
    numels = t * n * int(kvlen[-1]) if keep_prob < 1 else 0
    return (out.to(query.dtype), row_max.unsqueeze(-1).expand(t, n, 8).contiguous(),
            row_sum.unsqueeze(-1).expand(t, n, 8).contiguous(), query.new_empty([0]),
            _dropout_seed() if keep_prob < 1 else 0, 0, numels)


__all__ = ["fast_gelu", "npu_add_rms_norm", "npu_apply_rotary_pos_emb", "npu_confusion_transpose",
           "npu_fast_gelu", "npu_fusion_attention", "npu_gelu", "npu_rms_norm", "npu_rotary_mul", "npu_silu",
           "npu_swiglu"]
