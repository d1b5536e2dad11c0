"""torch_npu's ops as op-plugin registers them: ``torch.ops.npu.*`` with op-plugin's schemas, the same ops as
``torch_npu.npu_*``, for npu tensors only (a CPU tensor gets torch's dispatcher error, as on torch_npu), with
autograd. Oracles: op-plugin's schema strings, and the operators' formulas on CPU tensors."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F

import torch_npu

pytestmark = pytest.mark.timeout(120)

# op_plugin_functions.yaml / npu_native_functions.yaml, as torch prints a schema
SCHEMAS = {
    "npu_rms_norm.default": "npu::npu_rms_norm(Tensor self, Tensor gamma, float epsilon=9.9999999999999995e-07) -> "
                            "(Tensor, Tensor)",
    "npu_swiglu.default": "npu::npu_swiglu(Tensor self, int dim=-1) -> Tensor",
    "npu_gelu.default": "npu::npu_gelu(Tensor self, *, str approximate=\"none\") -> Tensor",
    "npu_rotary_mul.default": "npu::npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode=\"half\", "
                              "Tensor? rotate=None) -> Tensor",
    "npu_format_cast.Tensor": "npu::npu_format_cast.Tensor(Tensor self, Tensor dst, *, int? customize_dtype=None, "
                              "int? input_dtype=None) -> Tensor",
    "npu_format_cast_.acl_format": "npu::npu_format_cast_.acl_format(Tensor(a!) self, int acl_format, *, "
                                   "int? customize_dtype=None, int? input_dtype=None) -> Tensor(a!)",
    "get_npu_format.default": "npu::get_npu_format(Tensor self) -> int",
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schemas_are_op_plugins(name):
    packet, overload = name.split(".")
    assert str(getattr(getattr(torch.ops.npu, packet), overload)._schema) == SCHEMAS[name]


def test_fusion_attention_schema_returns_and_defaults():
    schema = torch.ops.npu.npu_fusion_attention.default._schema
    names = [a.name for a in schema.arguments]
    assert names[:5] == ["query", "key", "value", "head_num", "input_layout"]
    assert names[-5:] == ["softmax_layout", "sink", "dropout_mask", "seed", "offset"] and len(names) == 24
    assert [str(r.type) for r in schema.returns] == ["Tensor"] * 4 + ["int"] * 3


def _rms(x, g, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def test_ops_namespace_equals_torch_npu_functions_and_differentiates():
    x, g = torch.randn(4, 16), torch.randn(16)
    nx, ng = x.npu().requires_grad_(), g.npu().requires_grad_()
    y, rstd = torch.ops.npu.npu_rms_norm(nx, ng, 1e-5)
    assert y.device.type == "npu" and rstd.dtype == torch.float32 and rstd.shape == (4, 1)
    assert torch.allclose(y.detach().cpu(), _rms(x, g, 1e-5), atol=1e-5)
    assert torch.equal(torch_npu.npu_rms_norm(nx, ng, epsilon=1e-5)[0].detach().cpu(), y.detach().cpu())
    y.square().sum().backward()
    cx, cg = x.clone().requires_grad_(), g.clone().requires_grad_()
    _rms(cx, cg, 1e-5).square().sum().backward()
    assert torch.allclose(nx.grad.cpu(), cx.grad, atol=1e-4) and torch.allclose(ng.grad.cpu(), cg.grad, atol=1e-4)
    s = torch.randn(3, 8)
    out = torch.ops.npu.npu_swiglu(s.npu(), -1)
    assert torch.allclose(out.cpu(), F.silu(s[:, :4]) * s[:, 4:], atol=1e-6)
    assert torch.allclose(torch.ops.npu.npu_gelu(s.npu(), approximate="tanh").cpu(), F.gelu(s, approximate="tanh"))
    with torch.inference_mode():                                   # the PrivateUse1 kernel, below autograd
        assert torch.allclose(torch.ops.npu.npu_rms_norm(x.npu(), g.npu())[0].cpu(), _rms(x, g), atol=1e-5)


def test_format_ops_and_overloads():
    t = torch.rand(4, 8).npu()
    z = torch.ops.npu.npu_format_cast(t, 29)
    assert torch.ops.npu.get_npu_format(z) == 29 and torch.ops.npu.get_npu_format(t) == 2
    assert torch.equal(z.cpu(), t.cpu())
    w = torch.ops.npu.npu_format_cast.Tensor(t, z)                  # the format of another tensor
    assert torch.ops.npu.get_npu_format(w) == 29
    assert torch.ops.npu.npu_format_cast_(t, z) is t and torch_npu.get_npu_format(t) == torch_npu.Format.FRACTAL_NZ
    assert torch.ops.npu.npu_format_cast_(t, 2) is t and torch_npu.get_npu_format(t) == torch_npu.Format.ND


@pytest.mark.parametrize("call", [
    lambda: torch_npu.npu_rms_norm(torch.randn(2, 4), torch.randn(4)),
    lambda: torch.ops.npu.npu_rms_norm(torch.randn(2, 4), torch.randn(4)),
    lambda: torch_npu.npu_format_cast(torch.randn(2, 2), 29),
    lambda: torch_npu.get_npu_format(torch.randn(2, 2)),
    lambda: torch_npu.npu_swiglu(torch.randn(2, 4)),
    lambda: torch_npu.npu_fusion_attention(*(torch.randn(1, 2, 3, 4) for _ in range(3)), 2, "BNSD"),
])
def test_cpu_tensors_are_refused_by_the_dispatcher(call):
    with pytest.raises(NotImplementedError, match=r"Could not run 'npu::\w+' with arguments from the 'CPU' backend"):
        call()
