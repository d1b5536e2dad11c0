"""npu tensors' memory on the cards: torch_npu's caching allocator reserves segments on card k through the runtime
(``torch_npu/segments.py``), so ``torch.npu.memory_reserved(k)`` is what card k holds for this process —
``rt.get_mem_info`` and ``npu-smi`` see it, the card's HBM (shared with ``rt`` mallocs) bounds it, ``empty_cache``
and the process's exit give it back. The oracle is always the card's own answer."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch_npu  # noqa: F401
from torch_npu import _runtime

pytestmark = pytest.mark.timeout(120)
MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


def card_used(rt, index: int) -> int:
    """Bytes card ``index`` has reserved, as the card reports them (total less free)."""
    with _runtime.on(index):
        free, total = rt.get_mem_info()
    return total - free


@pytest.fixture
def cards(rt_factory):
    """In-process cards (8 x 2 GiB); this process's unused segments given back first."""
    rt = rt_factory()
    torch.npu.set_device(0)
    torch.npu.empty_cache()
    return rt


@pytest.fixture
def small_cards(rt_factory, tmp_path):
    """In-process cards of 64 MiB HBM each."""
    path = tmp_path / "small_hbm.toml"
    path.write_text(f"[card]\nhbm_bytes = {64 * MiB}\n")
    rt = rt_factory(str(path))
    torch.npu.set_device(0)
    torch.npu.empty_cache()
    return rt


def test_reserved_is_what_the_card_holds_in_torchs_segment_sizes(cards):
    used0 = card_used(cards, 0)
    base_alloc, base_res = torch.npu.memory_allocated(0), torch.npu.memory_reserved(0)
    small = torch.ones(1000, device="npu")                      # 4000 bytes: a 2 MiB small-pool segment
    assert torch.npu.memory_allocated(0) - base_alloc == 4000
    assert torch.npu.memory_reserved(0) - base_res == 2 * MiB == card_used(cards, 0) - used0
    mid = torch.zeros(3 * MiB, dtype=torch.uint8, device="npu")  # 1..10 MiB: a 20 MiB large-pool segment
    fits = torch.empty(16 * MiB, dtype=torch.uint8, device="npu")     # the rest of that segment: no new one
    assert torch.npu.memory_reserved(0) - base_res == (2 + 20) * MiB
    big = torch.empty(17 * MiB + 5, dtype=torch.uint8, device="npu")   # >= 10 MiB: rounded up to 2 MiB: 18 MiB
    reserved = torch.npu.memory_reserved(0) - base_res
    assert reserved == (2 + 20 + 18) * MiB == card_used(cards, 0) - used0
    assert torch.npu.memory_allocated(0) - base_alloc == 4000 + 3 * MiB + 16 * MiB + 17 * MiB + 5
    stats = torch.npu.memory_stats(0)
    assert stats["reserved_bytes.large_pool.current"] >= 38 * MiB and stats["segment.all.current"] >= 3
    with _runtime.on(0):
        assert torch.npu.mem_get_info(0) == tuple(cards.get_mem_info())      # the card's answer, as is
    assert float(small.sum()) == 1000 and int(mid.sum()) == 0 and big.numel() + fits.numel() == 33 * MiB + 5


def test_a_card_round_trip_per_segment_never_per_tensor(cards, monkeypatch):
    import rt
    calls = []
    real = rt.malloc
    monkeypatch.setattr(rt, "malloc", lambda size, policy=0: calls.append(size) or real(size, policy))
    keep = [torch.full((64,), float(i), device="npu") for i in range(200)]     # 200 x 256 B -> 200 x 512 B blocks
    assert torch.npu.memory_allocated(0) >= 200 * 256
    assert len(calls) == 2                   # one 2 MiB small segment: two 1 MiB blocks of the card
    x = torch.randn(64, 64, device="npu")
    for _ in range(50):                      # results die and their room is reused: no new segment
        x = torch.tanh(x @ x)
    assert len(calls) == 2
    assert sum(float(t[0]) for t in keep) == sum(range(200))


def test_the_card_refuses_past_its_hbm_with_torch_npus_text(small_cards):
    a = torch.empty(20 * MiB, dtype=torch.uint8, device="npu")     # a 20 MiB segment
    with _runtime.on(0):
        other = small_cards.malloc(10 * MiB)                  # someone else's memory on the card: 12 MiB of it
    b = torch.empty(15 * MiB, dtype=torch.uint8, device="npu")   # a 16 MiB segment: 48 of 64 MiB used
    assert card_used(small_cards, 0) == 48 * MiB
    with pytest.raises(torch.OutOfMemoryError) as e:
        torch.empty(3 * MiB, dtype=torch.uint8, device="npu")      # wants a 20 MiB segment: 16 MiB left
    assert str(e.value) == (
        "NPU out of memory. Tried to allocate 20.00 MiB (NPU 0; 64.00 MiB total capacity; 35.00 MiB already "
        "allocated; 35.00 MiB current active; 16.00 MiB free; 36.00 MiB reserved in total by PyTorch).If reserved "
        "memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.")
    stats = torch.npu.memory_stats(0)
    assert stats["num_ooms"] >= 1 and stats["num_alloc_retries"] >= 1
    with _runtime.on(0):
        small_cards.free(other)
    c = torch.empty(3 * MiB, dtype=torch.uint8, device="npu")     # fits once the other memory is gone
    assert torch.npu.memory_reserved(0) == card_used(small_cards, 0) == (20 + 16 + 20) * MiB
    with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 18\.00 MiB \(NPU 0; 64\.00 MiB total"):
        torch.randn(18 * MiB // 4, device="npu")            # 18 MiB: no segment has room, the card has 8 MiB
    del a, b, c


def test_a_dead_tensor_stays_reserved_until_empty_cache(cards):
    used0, res0 = card_used(cards, 0), torch.npu.memory_reserved(0)
    t = torch.empty(12 * MiB, dtype=torch.uint8, device="npu")
    alloc = torch.npu.memory_allocated(0)
    del t
    assert torch.npu.memory_allocated(0) == alloc - 12 * MiB
    assert torch.npu.memory_reserved(0) - res0 == 12 * MiB == card_used(cards, 0) - used0   # cached, as torch
    again = torch.empty(12 * MiB, dtype=torch.uint8, device="npu")          # reuses the cached segment
    assert torch.npu.memory_reserved(0) - res0 == 12 * MiB
    del again
    torch.npu.empty_cache()
    assert torch.npu.memory_reserved(0) == res0 and card_used(cards, 0) == used0
    assert torch.npu.memory_stats(0)["segment.all.freed"] >= 1


def test_two_cards_are_accounted_separately(cards):
    used = [card_used(cards, 0), card_used(cards, 1)]
    res = [torch.npu.memory_reserved(0), torch.npu.memory_reserved(1)]
    a = torch.empty(3 * MiB, dtype=torch.uint8, device="npu:0")
    b = torch.ones(10, 10, device="npu:1")
    c = b.to("npu:0")                                      # a copy to card 0: a small segment there
    assert torch.npu.memory_reserved(0) - res[0] == card_used(cards, 0) - used[0] == 22 * MiB
    assert torch.npu.memory_reserved(1) - res[1] == card_used(cards, 1) - used[1] == 2 * MiB
    assert torch.equal(c.cpu(), torch.ones(10, 10)) and a.device.index == 0


def test_segments_released_with_the_context_are_dropped(cards):
    t = torch.empty(12 * MiB, dtype=torch.uint8, device="npu:1")
    assert torch.npu.memory_reserved(1) >= 12 * MiB
    cards.reset_device(1)                                  # the card frees what the context held
    assert torch.npu.memory_reserved(1) == 0 and card_used(cards, 1) == 0
    assert torch.npu.memory_allocated(1) >= 12 * MiB       # the tensor's host bytes live on
    del t


def test_without_a_runtime_tensors_are_counted_against_the_config(monkeypatch):
    import rt
    assert not rt.is_initialized()
    res0, alloc0 = torch.npu.memory_reserved(3), torch.npu.memory_allocated(3)
    t = torch.empty(5000, dtype=torch.uint8, device="npu:3")
    assert torch.npu.memory_allocated(3) - alloc0 == torch.npu.memory_reserved(3) - res0 == 5000
    free, total = torch.npu.mem_get_info(3)
    assert total == 2 << 30 and free == total - torch.npu.memory_reserved(3)
    del t


CHILD = r'''
import os, sys
import torch, torch_npu
torch.npu.set_device(0)
a = torch.empty(3 << 20, dtype=torch.uint8, device="npu")
b = torch.ones(1000, device="npu")
print(os.getpid(), torch.npu.memory_allocated(0), torch.npu.memory_reserved(0), flush=True)
sys.stdin.readline()
'''


@pytest.mark.ray
def test_npu_smi_sees_a_ranks_segments_and_its_exit_gives_them_back(ray_rt, monkeypatch):
    """A rank on Ray-hosted cards (reached over their sockets, as under ``launch``): its segments are on the card
    (``rt.get_mem_info`` of another process, ``npu-smi``), and gone once it exits."""
    from launcher.tools import smi
    from rt.ray import session
    sockets = os.path.join(session.socket_root(), f"ray-{os.environ['NPUSIM_JOB']}")
    ray_rt.set_device(0)
    used0 = card_used(ray_rt, 0)
    env = {k: v for k, v in os.environ.items() if k not in ("NPUSIM_BACKEND", "WORLD_SIZE", "RANK")}
    env.update(NPUSIM_CARD_DIR=sockets, ASCEND_RT_VISIBLE_DEVICES="0,1", PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        line = child.stdout.readline()
        assert line, child.stderr.read()[-3000:]
        pid, allocated, reserved = map(int, line.split())
        assert allocated == 3 * MiB + 4000 and reserved == 22 * MiB
        assert card_used(ray_rt, 0) - used0 == reserved
        doc = smi.collect()
        procs = [p for s in doc["sessions"] for c in s["cards"] if c["npu"] == 0 for p in (c["processes"] or ())
                 if p["pid"] == pid]
        assert [p["memory_bytes"] for p in procs] == [reserved], json.dumps(doc)[-3000:]
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0, child.stderr.read()[-3000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    deadline = time.monotonic() + 30                    # the card notices the closed connection
    while card_used(ray_rt, 0) != used0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert card_used(ray_rt, 0) == used0, "the exited rank's segments are still on card 0"
