"""torch_npu's formats and fused operators against plain torch on CPU: the oracles below are written from the
operators' published formulas (torch's scaled_dot_product_attention for the attention), not from ops.py.

The ops run on npu tensors only (as on torch_npu): ``on_npu.npu_x(...)`` calls ``torch_npu.npu_x`` on npu copies
of the CPU arguments (differentiable copies, so gradients reach the CPU leaves) and the oracles stay on CPU."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F

import torch_npu

pytestmark = pytest.mark.timeout(120)


def close(a, b, tol=1e-5):
    return torch.allclose(a.detach().cpu().float(), b.detach().cpu().float(), atol=tol, rtol=tol)


class _OnNpu:
    """``on_npu.npu_rms_norm(x, g)``: ``on_npu.npu_rms_norm`` on npu copies of the tensor arguments."""

    def __getattr__(self, name):
        op = getattr(torch_npu, name)

        def call(*args, **kwargs):
            move = lambda a: a.npu() if isinstance(a, torch.Tensor) else a  # noqa: E731
            return op(*map(move, args), **{k: move(v) for k, v in kwargs.items()})
        return call


on_npu = _OnNpu()


def test_format_cast_tracks_the_format_and_keeps_the_data():
    x = torch.rand(2, 3, 4, 5).npu()
    assert torch_npu.get_npu_format(x) == 0 == torch_npu.Format.NCHW
    assert torch_npu.get_npu_format(torch.rand(3, 4).npu()) == torch_npu.Format.ND
    y = torch_npu.npu_format_cast(x, 29)
    assert torch_npu.get_npu_format(y) == torch_npu.Format.FRACTAL_NZ
    assert str(torch_npu.get_npu_format(y)) == "FRACTAL_NZ"
    assert torch.equal(y.cpu(), x.cpu()) and y is not x and torch_npu.get_npu_format(x) == 0
    assert torch_npu.npu_format_cast(y, torch_npu.Format.FRACTAL_NZ) is y
    assert torch_npu.npu_format_cast_(x, y) is x and torch_npu.get_npu_format(x) == 29
    torch_npu.npu_format_cast_(x, 2)
    assert torch_npu.get_npu_format(x) == 2
    w = torch.rand(3, 3, requires_grad=True)
    torch_npu.npu_format_cast(w.npu(), 3).sum().backward()
    assert torch.equal(w.grad, torch.ones(3, 3))
    with pytest.raises(RuntimeError, match="unsupported acl_format 999"):
        torch_npu.npu_format_cast(x, 999)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rms_norm(dtype):
    x = torch.randn(4, 6, 32).to(dtype)
    gamma = torch.randn(32).to(dtype)
    y, rstd = on_npu.npu_rms_norm(x, gamma, epsilon=1e-5)
    xf = x.float()
    want_rstd = 1 / torch.sqrt((xf * xf).mean(-1, keepdim=True) + 1e-5)
    assert y.dtype == dtype and y.shape == x.shape
    assert rstd.dtype == torch.float32 and rstd.shape == (4, 6, 1)
    assert close(rstd, want_rstd)
    assert close(y, xf * want_rstd * gamma.float(), 1e-5 if dtype == torch.float32 else 1e-2)
    _, rstd2 = on_npu.npu_rms_norm(x, torch.ones(6, 32, dtype=dtype))
    assert rstd2.shape == (4, 1, 1)
    with pytest.raises(RuntimeError, match="trailing dims"):
        on_npu.npu_rms_norm(x, torch.ones(31))
    out, _, s = on_npu.npu_add_rms_norm(x, x, gamma)
    assert close(s, x + x) and close(out, on_npu.npu_rms_norm(x + x, gamma)[0])


def test_rms_norm_backward_matches_the_composition():
    x = torch.randn(3, 16, requires_grad=True)
    g = torch.randn(16, requires_grad=True)
    on_npu.npu_rms_norm(x, g)[0].pow(2).sum().backward()
    x2, g2 = x.detach().clone().requires_grad_(), g.detach().clone().requires_grad_()
    (x2 * torch.rsqrt(x2.pow(2).mean(-1, keepdim=True) + 1e-6) * g2).pow(2).sum().backward()
    assert close(x.grad, x2.grad, 1e-4) and close(g.grad, g2.grad, 1e-4)


def test_rotary_mul_half_interleave_and_matrix():
    x = torch.randn(2, 5, 3, 8)
    cos, sin = torch.randn(1, 5, 1, 8), torch.randn(1, 5, 1, 8)
    x1, x2 = x[..., :4], x[..., 4:]
    assert close(on_npu.npu_rotary_mul(x, cos, sin), x * cos + torch.cat((-x2, x1), -1) * sin)
    even, odd = x[..., 0::2], x[..., 1::2]
    inter = torch.stack((-odd, even), dim=-1).reshape(x.shape)
    assert close(on_npu.npu_rotary_mul(x, cos, sin, "interleave"), x * cos + inter * sin)
    rot = torch.zeros(8, 8)
    for i in range(4):                                 # the matrix of rotate_half: x @ rot == cat(-x2, x1)
        rot[i + 4, i] = -1
        rot[i, i + 4] = 1
    assert close(on_npu.npu_rotary_mul(x, cos, sin, rotate=rot), on_npu.npu_rotary_mul(x, cos, sin))
    with pytest.raises(RuntimeError, match="should be half or interleave, but got quarter"):
        on_npu.npu_rotary_mul(x, cos, sin, "quarter")
    q, k = x.clone().npu(), (x.clone() * 2).npu()
    torch_npu.npu_apply_rotary_pos_emb(q, k, cos.npu(), sin.npu())
    assert close(q, on_npu.npu_rotary_mul(x, cos, sin)) and close(k, on_npu.npu_rotary_mul(x * 2, cos, sin))


def test_swiglu_and_gelus():
    x = torch.randn(3, 10, 6)
    assert close(on_npu.npu_swiglu(x), F.silu(x[..., :3]) * x[..., 3:])
    assert close(on_npu.npu_swiglu(x, dim=1), F.silu(x[:, :5]) * x[:, 5:])
    assert on_npu.npu_swiglu(x.half()).dtype == torch.float16
    with pytest.raises(RuntimeError, match="must be divisible by 2"):
        on_npu.npu_swiglu(torch.randn(3, 5))
    assert close(on_npu.npu_gelu(x, approximate="tanh"), F.gelu(x, approximate="tanh"))
    fast = x * torch.sigmoid(1.702 * x)                # FastGelu is x * sigmoid(1.702 x), written another way
    assert close(on_npu.npu_fast_gelu(x), fast, 1e-5) and close(on_npu.fast_gelu(x), fast, 1e-5)
    t = torch.randn(2, 3, 4)
    assert torch.equal(on_npu.npu_confusion_transpose(t, (0, 2, 1), (2, 12), True).cpu(),
                       t.permute(0, 2, 1).reshape(2, 12))


def _sdpa(q, k, v, masked, scale):
    """Oracle: torch's SDPA on BNSD with a True-is-masked mask (SDPA's bool mask is True-is-kept)."""
    keep = None if masked is None else ~masked
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=keep, scale=scale)


def _layout(t, layout):
    b, n, s, d = t.shape
    return {"BNSD": t, "BSND": t.transpose(1, 2), "BSH": t.transpose(1, 2).reshape(b, s, n * d),
            "SBH": t.permute(2, 0, 1, 3).reshape(s, b, n * d)}[layout]


@pytest.mark.parametrize("layout", ["BNSD", "BSND", "BSH", "SBH"])
def test_fusion_attention_layouts_gqa_and_returns(layout):
    b, n1, n2, s1, s2, d = 2, 4, 2, 5, 7, 8
    q, k, v = torch.randn(b, n1, s1, d), torch.randn(b, n2, s2, d), torch.randn(b, n2, s2, d)
    scale = d ** -0.5
    out, smax, ssum, sout, seed, offset, numels = on_npu.npu_fusion_attention(
        _layout(q, layout), _layout(k, layout), _layout(v, layout), n1, layout, scale=scale)
    want = _sdpa(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), None, scale)
    assert out.shape == _layout(q, layout).shape and close(out, _layout(want, layout), 1e-5)
    scores = q @ k.repeat_interleave(2, 1).transpose(-1, -2) * scale
    assert smax.shape == ssum.shape == (b, n1, s1, 8) and smax.dtype == torch.float32
    assert close(smax[..., 3], scores.amax(-1))
    assert close(ssum[..., 0], torch.exp(scores - scores.amax(-1, True)).sum(-1))
    assert sout.numel() == 0 and (seed, offset, numels) == (0, 0, 0)


@pytest.mark.parametrize("mode", [0, 2, 3, 4])
def test_fusion_attention_masks_and_gradients(mode):
    b, n, s1, s2, d = 1, 2, 6, 9, 4
    q = torch.randn(b, n, s1, d, requires_grad=True)
    k = torch.randn(b, n, s2, d, requires_grad=True)
    v = torch.randn(b, n, s2, d, requires_grad=True)
    i, j = torch.arange(s1)[:, None], torch.arange(s2)[None, :]
    band0 = (j - i > 1) | (i - j > 2)                 # mode 0: the atten_mask, and outside pre/next tokens
    rel = j - i - (s2 - s1)                           # modes 3 and 4 anchor at the lower-right corner
    masked = {0: ((i + j) % 3 == 0) | band0, 2: j > i, 3: rel > 0, 4: (rel > 1) | (rel < -2)}[mode]
    given = (i + j) % 3 == 0 if mode == 0 else torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    out = on_npu.npu_fusion_attention(q, k, v, n, "BNSD", atten_mask=given, scale=0.5, sparse_mode=mode,
                                         pre_tockens=2, next_tockens=1)[0]
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    want = _sdpa(qs, ks, vs, masked, 0.5)
    assert close(out, want, 1e-5)
    out.square().sum().backward()
    want.square().sum().backward()
    for got, ref in ((q.grad, qs.grad), (k.grad, ks.grad), (v.grad, vs.grad)):
        assert close(got, ref, 1e-4)


def test_fusion_attention_tnd_pse_dtype_dropout_and_errors():
    n, d = 2, 4
    lens = [3, 5]
    q, k, v = torch.randn(5, n, d), torch.randn(5, n, d), torch.randn(5, n, d)
    out, smax = on_npu.npu_fusion_attention(q, k, v, n, "TND", scale=0.5, sparse_mode=3,
                                               actual_seq_qlen=lens, actual_seq_kvlen=lens)[:2]
    for a, z in ((0, 3), (3, 5)):
        seq = [t[a:z].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
        ln = z - a
        mask = torch.arange(ln)[None, :] > torch.arange(ln)[:, None]
        assert close(out[a:z], _sdpa(*seq, mask, 0.5)[0].transpose(0, 1))
    assert smax.shape == (5, n, 8)
    qb, kb, vb = (torch.randn(1, 2, 4, 8) for _ in range(3))
    pse = torch.randn(1, 2, 4, 4)
    want = torch.softmax(0.3 * (pse + qb @ kb.transpose(-1, -2)), -1) @ vb
    assert close(on_npu.npu_fusion_attention(qb, kb, vb, 2, "BNSD", pse=pse, scale=0.3)[0], want, 1e-5)
    half = on_npu.npu_fusion_attention(qb.half(), kb.half(), vb.half(), 2, "BNSD", scale=0.3)[0]
    assert half.dtype == torch.float16
    res = on_npu.npu_fusion_attention(qb, kb, vb, 2, "BNSD", keep_prob=0.5)
    assert res[6] == 1 * 2 * 4 * 4
    with pytest.raises(RuntimeError, match="The input_layout should be BSH/SBH/BNSD/BSND/TND"):
        on_npu.npu_fusion_attention(qb, kb, vb, 2, "NSBD")
    with pytest.raises(RuntimeError, match=r"The keep_prob value must be in range of \(0, 1\]"):
        on_npu.npu_fusion_attention(qb, kb, vb, 2, "BNSD", keep_prob=0)
    with pytest.raises(RuntimeError, match="head_num must > 0"):
        on_npu.npu_fusion_attention(qb, kb, vb, 0, "BNSD")


def test_fused_ops_on_npu_tensors_match_cpu_with_gradients():
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    x, g = torch.randn(3, 8), torch.randn(8)
    leaves = [t.clone().npu().requires_grad_() for t in (q, k, v, x, g)]
    nq, nk, nv, nx, ng = leaves
    out = torch_npu.npu_fusion_attention(nq, nk, nv, 2, "BNSD", scale=0.3, sparse_mode=2,
                                         atten_mask=torch.ones(2048, 2048, dtype=torch.bool).triu(1).npu())[0]
    y = torch_npu.npu_rms_norm(nx, ng)[0]
    assert out.device.type == "npu" and y.device.type == "npu"
    (out.sum() + y.sum()).backward()
    cpu = [t.clone().requires_grad_() for t in (q, k, v, x, g)]
    mask = torch.ones(5, 5, dtype=torch.bool).triu(1)
    want = _sdpa(*cpu[:3], mask, 0.3)
    (want.sum() + on_npu.npu_rms_norm(cpu[3], cpu[4])[0].sum()).backward()
    assert close(out, want) and close(y, on_npu.npu_rms_norm(x, g)[0])
    for got, ref in zip(leaves, cpu):
        assert got.grad.device.type == "npu" and close(got.grad, ref.grad, 1e-4)
    z = torch_npu.npu_format_cast(nx.detach(), 29)
    assert z.device.type == "npu" and torch_npu.get_npu_format(z) == 29 and torch.equal(z.cpu(), x)
