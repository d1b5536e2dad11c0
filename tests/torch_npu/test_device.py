"""The ``npu`` device type: device semantics, operators and training against plain torch on the CPU (the oracle),
torch.save/load with map_location, and the bytes npu tensors count on their card (torch.npu memory statistics).
Skipped when torch is not installed."""

import gc
import io
import threading

import pytest

torch = pytest.importorskip("torch")
import torch_npu  # noqa: F401  - registers the npu device
from torch_npu import memory, storage

F = torch.nn.functional


def close(npu_value, cpu_value, **tol):
    assert npu_value.device.type == "npu"
    torch.testing.assert_close(npu_value.cpu(), cpu_value, **tol)


def test_npu_is_a_device_type_of_its_own():
    assert torch.device("npu:1").type == "npu" and torch.device("npu:1").index == 1
    t = torch.arange(6.0).reshape(2, 3)
    for moved, index in ((t.npu(), 0), (t.to("npu:1"), 1), (t.to(torch.device("npu", 1)), 1), (t.npu(1), 1)):
        assert moved.device == torch.device("npu", index)
        assert moved.is_npu and moved.device.type == "npu" and not moved.is_cpu
        back = moved.cpu()
        assert back.device.type == "cpu" and torch.equal(back, t)
    assert not t.is_npu
    z = torch.zeros(2, 3, device="npu")
    assert z.device == torch.device("npu", 0) and z.sum().item() == 0
    assert torch.ones(4, dtype=torch.int64, device="npu:1").device.index == 1
    assert torch.full((2,), 7.0, device="npu").cpu().tolist() == [7.0, 7.0]
    assert torch.randn(3, device="npu").device.type == "npu"


def test_module_npu_moves_parameters_and_buffers():
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).npu()
    assert all(p.device.type == "npu" for p in m.parameters())
    assert all(b.device.type == "npu" for b in m.buffers())
    m2 = torch.nn.Linear(3, 4).to("npu:1")
    assert m2.weight.device == torch.device("npu", 1)
    assert m2.cpu().weight.device.type == "cpu"


def test_devices_do_not_mix_as_torch_says():
    a, c = torch.ones(3, device="npu"), torch.ones(3)
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device, but found at least two "
                                           r"devices, npu:0 and cpu!"):
        a + c
    with pytest.raises(RuntimeError, match="npu:0 and npu:1"):
        a + torch.ones(3, device="npu:1")
    assert (a + torch.tensor(2.0)).cpu().tolist() == [3.0, 3.0, 3.0]       # a 0-dim CPU scalar is allowed
    with pytest.raises(TypeError, match="npu"):
        a.numpy()
    assert a[torch.tensor([0, 2])].device.type == "npu"                    # CPU indices, as on CUDA


OPS = [
    ("matmul", lambda x, y: x @ y.T),
    ("softmax", lambda x, y: F.softmax(x, -1)),
    ("layer_norm", lambda x, y: F.layer_norm(x, (x.shape[-1],))),
    ("cat_where", lambda x, y: torch.where(x > 0, torch.cat([x, y])[:4], y)),
    ("reductions", lambda x, y: torch.stack([x.sum(), x.mean(), x.amax(), x.std(), x.norm()])),
    ("sort_topk", lambda x, y: torch.cat([x.sort(-1).values, x.topk(2, -1).values], -1)),
    ("cumsum_einsum", lambda x, y: torch.einsum("ij,kj->ik", x.cumsum(0), y)),
    ("views", lambda x, y: x.t().contiguous().reshape(-1)[::3] + y.flatten()[:x.numel()][::3]),
    ("index_ops", lambda x, y: x.index_select(0, torch.tensor([3, 0], device=x.device))
     + x.gather(1, torch.zeros(4, 5, dtype=torch.long, device=x.device))[:2]),
    ("conv", lambda x, y: F.conv1d(x[None], y[:, :4, None].repeat(1, 1, 2))),
    ("embedding", lambda x, y: F.embedding(torch.tensor([[1, 2], [3, 0]], device=x.device), x)),
    ("dtype_casts", lambda x, y: (x.half() * 2).float() + x.to(torch.float64).sqrt().nan_to_num().float()),
]


@pytest.mark.parametrize("name, fn", OPS, ids=[n for n, _ in OPS])
def test_operators_match_cpu(name, fn):
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    expected = fn(x, y)
    close(fn(x.npu(), y.npu()), expected, rtol=1e-5, atol=1e-5)


def test_in_place_writes_reach_views_and_the_base():
    base = torch.zeros(3, 4).npu()
    row = base[1]
    row.add_(5)
    base[:, 2].mul_(0).add_(1)
    expected = torch.zeros(3, 4)
    expected[1] += 5
    expected[:, 2] = 1
    close(base, expected)
    assert row.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    out = torch.empty(0, device="npu")
    torch.add(torch.ones(2, 2, device="npu"), 1, out=out)                 # out= resizes an empty npu tensor
    close(out, torch.full((2, 2), 2.0))
    grown = torch.ones(2, device="npu")
    grown.resize_(5)
    assert grown.shape == (5,) and grown[:2].cpu().tolist() == [1.0, 1.0]


def test_views_that_change_the_dtype_share_the_bytes():
    c = torch.randn(4, dtype=torch.complex64)
    n = c.npu()
    real = torch.view_as_real(n)
    close(real, torch.view_as_real(c))
    real.mul_(2)
    close(n, c * 2)
    close(n.view(torch.int32), (c * 2).view(torch.int32))
    close(torch.view_as_complex(real), c * 2)
    close(torch.arange(8).npu()[2:].view(torch.int32), torch.arange(8)[2:].view(torch.int32))


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Dropout(0.0),
                               torch.nn.Linear(16, 3))


def _train(device, optimizer, steps=4):
    model = _mlp().to(device)
    opt = optimizer(model.parameters())
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        opt.zero_grad()
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def test_autograd_gradients_match_cpu():
    x = torch.randn(5, 6)
    cpu_model, npu_model = _mlp(), _mlp().npu()
    (cpu_model(x) ** 2).sum().backward()
    (npu_model(x.npu()) ** 2).sum().backward()
    for p, q in zip(npu_model.parameters(), cpu_model.parameters()):
        assert p.grad.device.type == "npu"
        close(p.grad, q.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make", [lambda: torch.nn.Conv2d(3, 4, 3, padding=1),
                                  lambda: torch.nn.ConvTranspose2d(3, 4, 3, stride=2),
                                  lambda: torch.nn.Conv1d(3, 6, 2, groups=3, bias=False)],
                         ids=["conv2d", "conv_transpose2d", "grouped_conv1d"])
def test_convolution_forward_and_backward_match_cpu(make):
    """torch routes convolutions of a device it has no kernel for to ``convolution_overrideable``."""
    torch.manual_seed(0)
    cpu_conv = make()
    npu_conv = make().npu()
    npu_conv.load_state_dict(cpu_conv.state_dict())
    x = torch.randn(2, 3, 7) if isinstance(cpu_conv, torch.nn.Conv1d) else torch.randn(2, 3, 5, 5)
    xc, xn = x.clone().requires_grad_(), x.npu().requires_grad_()
    close(npu_conv(xn), cpu_conv(xc), rtol=1e-5, atol=1e-5)
    cpu_conv(xc).square().sum().backward()
    npu_conv(xn).square().sum().backward()
    close(xn.grad, xc.grad, rtol=1e-4, atol=1e-4)
    for p, q in zip(npu_conv.parameters(), cpu_conv.parameters()):
        close(p.grad, q.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("optimizer", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: torch.optim.Adam(ps, lr=0.01),
    lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=False)], ids=["sgd", "adam", "adamw"])
def test_optimizer_steps_match_cpu(optimizer):
    cpu_losses, cpu_model = _train("cpu", optimizer)
    npu_losses, npu_model = _train("npu", optimizer)
    torch.testing.assert_close(npu_losses, cpu_losses, rtol=1e-5, atol=1e-6)
    for p, q in zip(npu_model.parameters(), cpu_model.parameters()):
        close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)


def test_backward_on_another_thread():
    result = {}

    def work():
        w = torch.ones(3, device="npu", requires_grad=True)
        (w * 2).sum().backward()
        result["grad"] = w.grad.cpu()
    t = threading.Thread(target=work)
    t.start()
    t.join(30)
    assert result["grad"].tolist() == [2.0, 2.0, 2.0]


def test_state_dict_save_and_load_with_map_location():
    _, model = _train("npu", lambda ps: torch.optim.SGD(ps, lr=0.1), steps=1)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    for where, device in ((None, torch.device("npu", 0)), ("cpu", torch.device("cpu")),
                          ("npu:1", torch.device("npu", 1)), (torch.device("npu", 1), torch.device("npu", 1))):
        buf.seek(0)
        loaded = torch.load(buf, map_location=where)
        assert {v.device for v in loaded.values()} == {device}
        fresh = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Dropout(0.0),
                                    torch.nn.Linear(16, 3)).npu()
        fresh.load_state_dict(loaded)
        for p, q in zip(fresh.parameters(), model.parameters()):
            assert p.device.type == "npu" and torch.equal(p.detach().cpu(), q.detach().cpu())


def test_memory_allocated_counts_npu_tensors_on_their_card():
    gc.collect()                     # npu tensors in reference cycles of earlier tests die now, not mid-test
    storage.sweep()
    before0, before1 = memory.memory_allocated(0), memory.memory_allocated("npu:1")
    a = torch.empty(1000, device="npu:1")
    assert memory.memory_allocated(1) == before1 + 4000
    assert memory.memory_allocated(0) == before0
    view = a[10:20]
    assert memory.memory_allocated(1) == before1 + 4000                   # a view costs nothing
    del a, view
    assert memory.memory_allocated(1) == before1
    memory.reset_peak_memory_stats(1)
    b = torch.empty(2 << 20, dtype=torch.uint8, device="npu:1")
    assert memory.max_memory_allocated(1) == before1 + (2 << 20) == memory.memory_reserved(1)
    del b
    assert memory.max_memory_allocated(1) == before1 + (2 << 20) == memory.max_memory_reserved(1)
    stats = memory.memory_stats(1)
    assert stats["allocated_bytes.all.current"] == before1
    assert stats["allocated_bytes.large_pool.peak"] >= 2 << 20
    assert list(stats) == sorted(stats)
    assert "PyTorch NPU memory summary, device ID 1" in memory.memory_summary(1)
    with pytest.raises(ValueError, match="Expected a npu device, but got: cpu"):
        memory.memory_allocated("cpu")


def test_allocation_past_the_cards_hbm_fails_with_torch_npus_text():
    cap = storage.capacity(1)
    with pytest.raises(torch.OutOfMemoryError, match=r"NPU out of memory\. Tried to allocate [0-9.]+ GiB \(NPU 1; "
                                                     r"[0-9.]+ GiB total capacity; .* already allocated;"):
        torch.empty(cap + 1, dtype=torch.uint8, device="npu:1")
    assert memory.memory_stats(1)["num_ooms"] >= 1
