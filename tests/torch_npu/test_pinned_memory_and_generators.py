"""Pinned host memory and ``torch.Generator(device="npu")`` (torch_npu/hooks.cpp): ``pin_memory``, ``is_pinned``,
``DataLoader(pin_memory=True)``, ``non_blocking`` copies from pinned tensors; npu generators draw the numbers a CPU
generator with the same seed draws (the kernels are the CPU's), with torch's device checks. Oracle: CPU torch."""

import pytest

torch = pytest.importorskip("torch")
import torch_npu  # noqa: F401  - registers the npu device
from torch.utils.data import DataLoader, TensorDataset

pytestmark = pytest.mark.timeout(120)


def test_pin_memory_gives_a_pinned_copy():
    t = torch.randn(4, 5)
    p = t.pin_memory()
    assert p.is_pinned() and not t.is_pinned()
    assert p.device.type == "cpu" and p.data_ptr() != t.data_ptr() and torch.equal(p, t)
    assert p[1:, 2:].is_pinned()                      # a view inside the pinned block
    assert p.pin_memory().is_pinned()
    assert torch.empty(3, pin_memory=True).is_pinned()
    assert torch.zeros(2, 3, pin_memory=True).is_pinned()
    assert not torch.empty(3).is_pinned()
    assert torch.empty(0, pin_memory=True).is_pinned()


def test_freed_pinned_memory_is_not_pinned_any_more():
    p = torch.empty(1 << 16, pin_memory=True)
    ptr = p.data_ptr()
    del p
    fresh = [torch.empty(1 << 16) for _ in range(4)]   # plain allocations, possibly at the same address
    assert not any(f.is_pinned() for f in fresh), [f.data_ptr() == ptr for f in fresh]


def test_npu_tensors_are_not_pinned_and_cannot_be():
    t = torch.randn(3, device="npu")
    assert not t.is_pinned()
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        t.pin_memory()


@pytest.mark.parametrize("workers", [0, 1])
def test_dataloader_pins_batches_that_copy_to_npu_non_blocking(workers):
    x, y = torch.randn(10, 3), torch.arange(10)
    loader = DataLoader(TensorDataset(x, y), batch_size=4, pin_memory=True, num_workers=workers)
    seen = 0
    for bx, by in loader:
        assert bx.is_pinned() and by.is_pinned()
        nx, ny = bx.npu(non_blocking=True), by.to("npu", non_blocking=True)
        torch.npu.synchronize()
        assert nx.device.type == "npu" and ny.device.type == "npu"
        assert torch.equal(nx.cpu(), x[seen:seen + len(bx)]) and torch.equal(ny.cpu(), y[seen:seen + len(by)])
        seen += len(bx)
    assert seen == 10


def test_non_blocking_copy_back_into_pinned_memory():
    src = torch.randn(6, device="npu")
    dst = torch.empty(6, pin_memory=True)
    dst.copy_(src, non_blocking=True)
    torch.npu.synchronize()
    assert dst.is_pinned() and torch.equal(dst, src.cpu())


def test_npu_generator_draws_what_a_cpu_generator_with_its_seed_draws():
    g = torch.Generator(device="npu")
    assert g.device.type == "npu" and g.initial_seed() == torch.Generator().initial_seed()
    assert g.manual_seed(0) is g
    c = torch.Generator().manual_seed(0)
    for _ in range(2):                                 # the state advances as the CPU's does
        a, b = torch.randn(5, 3, generator=g, device="npu"), torch.randn(5, 3, generator=c)
        assert a.device.type == "npu" and torch.equal(a.cpu(), b)
    assert torch.equal(torch.randperm(20, generator=g, device="npu").cpu(), torch.randperm(20, generator=c))
    assert torch.equal(torch.randint(0, 9, (7,), generator=g, device="npu").cpu(),
                       torch.randint(0, 9, (7,), generator=c))
    p = torch.rand(4, 4, generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.bernoulli(p.npu(), generator=g).cpu(), torch.bernoulli(p, generator=c))
    assert torch.equal(torch.multinomial(p.npu(), 2, generator=g).cpu(), torch.multinomial(p, 2, generator=c))
    t, u = torch.empty(8, device="npu"), torch.empty(8)
    assert torch.equal(t.uniform_(generator=g).cpu(), u.uniform_(generator=c))
    assert torch.equal(t.normal_(2.0, 3.0, generator=g).cpu(), u.normal_(2.0, 3.0, generator=c))


def test_npu_generator_state_round_trips_and_is_its_own():
    g = torch.Generator(device="npu:1").manual_seed(42)
    assert g.device == torch.device("npu", 1)
    state = g.get_state()
    first = torch.randn(6, generator=g, device="npu:1")
    g.set_state(state)
    assert torch.equal(torch.randn(6, generator=g, device="npu:1"), first)
    twin = g.clone_state()
    assert twin.device == g.device
    assert torch.equal(torch.rand(3, generator=twin, device="npu").cpu(), torch.rand(3, generator=g, device="npu").cpu())
    torch.npu.manual_seed(7)                           # the default generator is not this one
    before = g.get_state()
    torch.randn(4, device="npu")
    assert torch.equal(g.get_state(), before)


def test_generator_of_another_device_type_is_refused_as_torch_refuses_it():
    g, c = torch.Generator(device="npu"), torch.Generator()
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'npu'"):
        torch.randperm(10, generator=g)                # a CPU op
    with pytest.raises(RuntimeError, match="Expected a 'npu' device type for generator but found 'cpu'"):
        torch.randn(3, generator=c, device="npu")
    with pytest.raises(RuntimeError, match="Expected a 'npu' device type for generator but found 'cpu'"):
        torch.empty(3, device="npu").uniform_(generator=c)
