"""Zero-element npu tensors keep their shapes as CPU torch keeps them: factories, in-place operators (whose ``self``
has no bytes but is no ``out=`` tensor to size), ``out=`` operators and ``cat``, each against CPU torch."""

import warnings

import pytest

torch = pytest.importorskip("torch")
import torch_npu  # noqa: F401,E402  - registers the npu device

SHAPES = [(0,), (8, 0), (0, 3), (2, 0, 4), (0, 0)]
DTYPES = [torch.float32, torch.int64, torch.bool]


def _same(npu, cpu):
    assert npu.device.type == "npu", npu.device
    assert (npu.shape, npu.dtype) == (cpu.shape, cpu.dtype)
    assert npu.stride() == cpu.stride(), (npu.stride(), cpu.stride())
    assert torch.equal(npu.cpu(), cpu)


def _both(make):
    """``make(device)`` on npu and on CPU, with CPU torch's warnings ("An output with one or more elements was
    resized") compared too."""
    results = []
    for device in ("npu", "cpu"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = make(device)
        results.append((out, sorted(str(w.message) for w in caught if "resized" in str(w.message))))
    (npu, npu_warnings), (cpu, cpu_warnings) = results
    assert npu_warnings == cpu_warnings
    return npu, cpu


FACTORIES = {
    "empty": lambda shape, dtype, d: torch.empty(shape, dtype=dtype, device=d).zero_(),
    "zeros": lambda shape, dtype, d: torch.zeros(shape, dtype=dtype, device=d),
    "ones": lambda shape, dtype, d: torch.ones(shape, dtype=dtype, device=d),
    "full": lambda shape, dtype, d: torch.full(shape, 1, dtype=dtype, device=d),
    "new_zeros": lambda shape, dtype, d: torch.ones(3, dtype=dtype, device=d).new_zeros(shape),
    "new_ones": lambda shape, dtype, d: torch.ones(3, dtype=dtype, device=d).new_ones(shape),
    "new_full": lambda shape, dtype, d: torch.ones(3, dtype=dtype, device=d).new_full(shape, 1),
    "new_empty": lambda shape, dtype, d: torch.ones(3, dtype=dtype, device=d).new_empty(shape).fill_(0),
    "zeros_like": lambda shape, dtype, d: torch.zeros_like(torch.empty(shape, dtype=dtype, device=d)),
    "ones_like": lambda shape, dtype, d: torch.ones_like(torch.empty(shape, dtype=dtype, device=d)),
    "full_like": lambda shape, dtype, d: torch.full_like(torch.empty(shape, dtype=dtype, device=d), 1),
    "rand": lambda shape, dtype, d: torch.rand(shape, device=d).to(dtype),
}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("factory", sorted(FACTORIES))
def test_factories_keep_zero_element_shapes(factory, dtype, shape):
    _same(*_both(lambda d: FACTORIES[factory](shape, dtype, d)))


IN_PLACE = {
    "zero_": lambda t: t.zero_(),
    "fill_": lambda t: t.fill_(1),
    "add_": lambda t: t.add_(1),
    "mul_": lambda t: t.mul_(2),
    "clamp_": lambda t: t.clamp_(0, 1),
    "copy_": lambda t: t.copy_(torch.zeros(t.shape)),
    "uniform_": lambda t: t.uniform_(),
    "masked_fill_": lambda t: t.masked_fill_(torch.ones(t.shape, dtype=torch.bool, device=t.device), 3.),
    "index_fill_": lambda t: t.index_fill_(0, torch.zeros(0, dtype=torch.long, device=t.device), 3.),
}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", sorted(IN_PLACE))
def test_in_place_ops_on_zero_element_tensors_keep_their_shape(op, shape):
    def run(device):
        t = torch.empty(shape, device=device)
        out = IN_PLACE[op](t)
        assert out is t
        return t
    _same(*_both(run))


@pytest.mark.parametrize("op", sorted(IN_PLACE))
def test_in_place_ops_on_a_zero_element_view_of_a_tensor_keep_its_shape(op):
    def run(device):
        base = torch.arange(12., device=device).reshape(4, 3)
        view = base[:, 1:1]
        assert IN_PLACE[op](view) is view
        return torch.cat([view.reshape(-1), base.reshape(-1)])     # the base is untouched, the view kept (4, 0)
    npu, cpu = _both(run)
    _same(npu, cpu)


OUTS = {                                    # out shape -> what the op makes of inputs of `shape`
    "add": lambda shape, d, out: torch.add(torch.ones(shape, device=d), 1, out=out),
    "mul": lambda shape, d, out: torch.mul(torch.ones(shape, device=d), torch.ones(shape, device=d), out=out),
    "sum_dim": lambda shape, d, out: torch.sum(torch.ones(shape, device=d), dim=-1, out=out),
    "cat": lambda shape, d, out: torch.cat([torch.ones(shape, device=d), torch.ones(shape, device=d)], out=out),
    "mm": lambda shape, d, out: torch.mm(torch.ones(shape[0], 0, device=d), torch.ones(0, 5, device=d), out=out),
}


@pytest.mark.parametrize("out_shape", [(0,), (8, 0), (3,), (2, 2)], ids=str)
@pytest.mark.parametrize("shape", [(8, 0), (0, 3), (2, 0, 4)], ids=str)
@pytest.mark.parametrize("op", sorted(OUTS))
def test_out_ops_size_their_outputs_as_cpu_torch(op, shape, out_shape):
    def run(device):
        out = torch.full(out_shape, 7., device=device)
        result = OUTS[op](shape, device, out)
        assert result is out
        return out
    _same(*_both(run))


CATS = [
    ([(8, 0), (8, 0)], 1),
    ([(8, 0), (8, 0)], 0),
    ([(0, 3), (2, 3)], 0),
    ([(0,), (2, 3)], 0),                     # a legacy 1-D empty tensor is skipped
    ([(2, 0, 4), (2, 3, 4)], 1),
    ([(0, 3)], 0),
    ([(0,), (0,)], 0),
]


@pytest.mark.parametrize("shapes,dim", CATS, ids=str)
def test_cat_with_zero_element_tensors_matches_cpu(shapes, dim):
    def run(device):
        g = torch.Generator().manual_seed(1)
        return torch.cat([torch.randn(s, generator=g).to(device) for s in shapes], dim=dim)
    _same(*_both(run))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_views_of_zero_element_tensors_share_their_storage(shape):
    for device in ("npu", "cpu"):
        t = torch.empty(shape, device=device)
        for view in (t.view(-1), t.reshape(shape), t.transpose(0, -1), t[:]):
            assert view.untyped_storage()._cdata == t.untyped_storage()._cdata, (device, view.shape)
        t.untyped_storage().resize_(16)                   # a view sees its base's storage grow
        assert t.view(-1).untyped_storage().nbytes() == 16
