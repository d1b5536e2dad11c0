"""``torch.npu`` as torch_npu's package: its submodules (``torch_npu.npu.utils``, ``.memory``, ``.streams``...),
the SoC's answers, the legacy tensor types, graph capture's refusal, and the caching allocator's controls
(``set_per_process_memory_fraction`` enforced on the card, ``caching_allocator_alloc``, ``memory_snapshot``);
the oracles are torch_npu's published rules and the card's own counts."""

import importlib
import math

import pytest

torch = pytest.importorskip("torch")
import torch_npu

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20


@pytest.fixture
def npu(rt_local):
    torch.npu.set_device(0)
    yield rt_local
    torch.npu.set_per_process_memory_fraction(1.0, 0)
    torch.npu.set_device(0)


def test_submodules_import_as_in_torch_npu():
    import torch_npu.npu.utils
    from torch_npu.npu.utils import get_cann_version, get_soc_version  # noqa: F401
    assert torch.npu is torch_npu.npu
    for name in ("utils", "memory", "streams", "random", "amp", "npu_config", "graphs"):
        module = importlib.import_module(f"torch_npu.npu.{name}")
        assert getattr(torch.npu, name) is module
    assert torch_npu.npu.streams.Stream is torch.npu.Stream
    assert torch_npu.npu.memory.memory_allocated is torch.npu.memory_allocated
    assert torch_npu.npu.random.manual_seed is torch.npu.manual_seed
    from torch_npu.npu.amp import GradScaler  # noqa: F401
    for name in torch.npu.__all__:
        assert hasattr(torch.npu, name), name


def test_utils_set_device_and_negative_index_is_a_no_op(npu):
    torch_npu.npu.utils.set_device(2)
    assert torch.npu.current_device() == 2
    torch.npu.set_device(-1)
    assert torch.npu.current_device() == 2
    with torch.npu.device(-1):
        assert torch.npu.current_device() == 2
    with pytest.raises(RuntimeError, match="invalid device 8"):
        torch_npu.npu.utils.set_device(8)


def test_soc_answers_follow_torch_npu_rules(monkeypatch):
    assert torch.npu.get_device_name(0) == "Ascend910B1"
    assert torch_npu.npu.utils.get_soc_version() == 220            # c10_npu::SocVersion::Ascend910B1
    assert torch.npu.is_support_inf_nan() and torch.npu.is_bf16_supported()
    assert torch_npu.npu.utils.get_cann_version() == "" == torch_npu.npu.utils.get_cann_version("HCCL")
    monkeypatch.setenv("INF_NAN_MODE_FORCE_DISABLE", "1")
    assert not torch.npu.is_support_inf_nan()
    monkeypatch.delenv("INF_NAN_MODE_FORCE_DISABLE")
    monkeypatch.setenv("INF_NAN_MODE_ENABLE", "0")
    with pytest.raises(RuntimeError, match="INF_NAN_MODE_ENABLE shouldn't be set to 0"):
        torch.npu.is_support_inf_nan()


def test_overflow_checks_in_inf_nan_mode():
    assert torch.npu.npu_check_overflow(torch.tensor([1.0, float("inf")]).npu())
    assert torch.npu.npu_check_overflow(float("nan"))
    assert not torch.npu.npu_check_overflow(torch.ones(4).npu())
    with pytest.raises(RuntimeError, match="please use npu_check_overflow"):
        torch.npu.get_npu_overflow_flag()
    with pytest.warns(UserWarning, match="clear_npu_overflow_flag is useless"):
        torch.npu.clear_npu_overflow_flag()


def test_sync_debug_mode_is_remembered():
    try:
        torch.npu.set_sync_debug_mode("warn")
        assert torch.npu.get_sync_debug_mode() == 1
        torch.npu.set_sync_debug_mode(2)
        assert torch.npu.get_sync_debug_mode() == 2
        with pytest.raises(RuntimeError, match="expected one of `default`, `warn`, `error`"):
            torch.npu.set_sync_debug_mode("loud")
    finally:
        torch.npu.set_sync_debug_mode("default")
    assert torch.npu.get_sync_debug_mode() == 0


def test_legacy_tensor_types():
    t = torch.npu.FloatTensor([1, 2, 3])
    assert t.device.type == "npu" and t.dtype == torch.float32 and t.cpu().tolist() == [1.0, 2.0, 3.0]
    assert isinstance(t, torch.npu.FloatTensor) and not isinstance(t, torch.npu.HalfTensor)
    assert not isinstance(t.cpu(), torch.npu.FloatTensor)
    e = torch.npu.LongTensor(2, 3)
    assert e.shape == (2, 3) and e.dtype == torch.int64 and e.is_npu
    assert torch.npu.BFloat16Tensor().numel() == 0
    assert t.type(torch.npu.HalfTensor).dtype == torch.float16
    assert t.type() == "torch.npu.FloatTensor"
    with pytest.raises(RuntimeError, match="expects device type: npu"):
        torch.npu.IntTensor([1], device="cpu")


def test_graph_capture_is_refused_with_the_reason():
    assert torch.npu.is_current_stream_capturing() is False
    for make in (torch.npu.NPUGraph, torch.npu.graph_pool_handle):
        with pytest.raises(RuntimeError, match="npusim does not simulate NPU graph capture"):
            make()
    with pytest.raises(RuntimeError, match="npusim does not simulate NPU graph capture"):
        torch.npu.make_graphed_callables(torch.nn.Linear(2, 2), (torch.ones(1, 2),))
    with pytest.raises(RuntimeError, match="no utilization rate"):
        torch.npu.utilization(0)
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.npu.utilization(8)


def test_cached_names_are_the_reserved_ones(npu):
    keep = torch.ones(3 * MiB // 4, device="npu")                  # 3 MiB: a 20 MiB large-pool segment
    assert torch.npu.memory_cached() == torch.npu.memory_reserved() >= 20 * MiB
    assert torch.npu.max_memory_cached() == torch.npu.max_memory_reserved()
    with pytest.warns(DeprecationWarning):
        torch.npu.reset_max_memory_cached()
    assert torch.npu.max_memory_reserved() == torch.npu.memory_reserved()
    del keep


def test_memory_fraction_caps_the_reserved_segments(npu):
    torch.npu.empty_cache()
    base = torch.npu.memory_allocated(0)
    total = npu.get_device_info(0).total_memory
    torch.npu.set_per_process_memory_fraction(0.05, 0)
    assert math.isclose(torch.npu.get_per_process_memory_fraction(0), 0.05, rel_tol=1e-6)
    allowed = int(0.05 * total)                                    # 102.40 MiB of the 2 GiB card
    a = torch.empty(60 * MiB, dtype=torch.uint8, device="npu:0")
    before = torch.npu.memory_stats(0)
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(60 * MiB, dtype=torch.uint8, device="npu:0")
    text = str(info.value)
    assert text.startswith("NPU out of memory. Tried to allocate 60.00 MiB (NPU 0; 2.00 GiB total capacity; ")
    assert f"free; {allowed / MiB:.2f} MiB allowed; " in text and "reserved in total by PyTorch)" in text
    after = torch.npu.memory_stats(0)
    assert after["num_ooms"] == before["num_ooms"] + 1
    assert after["num_alloc_retries"] == before["num_alloc_retries"] + 1
    assert torch.npu.memory_reserved(0) <= allowed
    del a                                                          # its segment is unused now: the retry frees it
    b = torch.empty(60 * MiB, dtype=torch.uint8, device="npu:0")
    assert torch.npu.memory_allocated(0) == base + 60 * MiB and torch.npu.memory_reserved(0) <= allowed
    torch.npu.set_per_process_memory_fraction(1.0, 0)
    assert torch.npu.get_per_process_memory_fraction(0) == 1.0
    c = torch.empty(60 * MiB, dtype=torch.uint8, device="npu:0")
    assert torch.npu.memory_allocated(0) == base + 120 * MiB
    del b, c
    with pytest.raises(TypeError, match="must be `float`"):
        torch.npu.set_per_process_memory_fraction(1, 0)
    with pytest.raises(ValueError, match="Invalid fraction value: 1.5"):
        torch.npu.set_per_process_memory_fraction(1.5, 0)


def test_caching_allocator_alloc_and_delete(npu):
    base = torch.npu.memory_allocated(1)
    ptr = torch.npu.caching_allocator_alloc(3000, device=1)
    assert ptr != 0 and torch.npu.memory_allocated(1) == base + 3000
    assert torch.npu.caching_allocator_alloc(0) == 0
    torch.npu.caching_allocator_delete(ptr)
    assert torch.npu.memory_allocated(1) == base
    with pytest.raises(RuntimeError, match="invalid device pointer"):
        torch.npu.caching_allocator_delete(ptr)
    with pytest.raises(TypeError, match="Invalid type for stream argument"):
        torch.npu.caching_allocator_alloc(16, stream="s")
    ptr = torch.npu.caching_allocator_alloc(16, stream=torch.npu.current_stream())
    torch.npu.caching_allocator_delete(ptr)


def test_memory_snapshot_lists_the_segments(npu):
    torch.npu.empty_cache()
    small = torch.ones(1000, device="npu:3")                      # 4000 bytes: a 4096-byte block, 2 MiB segment
    large = torch.ones(3 * MiB // 4, device="npu:3")               # 3 MiB: a 20 MiB segment
    segs = [s for s in torch.npu.memory_snapshot() if s["device"] == 3]
    assert sum(s["total_size"] for s in segs) == torch.npu.memory_reserved(3) >= 22 * MiB
    assert {"large", "small"} <= {s["segment_type"] for s in segs}
    active = [(b["requested_size"], b["size"]) for s in segs for b in s["blocks"] if b["state"] == "active_allocated"]
    assert (4000, 4096) in active and (3 * MiB, 3 * MiB) in active
    assert sum(n for n, _ in active) == torch.npu.memory_allocated(3)
    for s in segs:
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
    del small, large


def test_host_allocator_statistics_are_refused_with_the_reason():
    for call in (torch.npu.host_memory_stats, torch.npu.host_memory_stats_as_nested_dict,
                 torch.npu.reset_peak_host_memory_stats, torch.npu.reset_accumulated_host_memory_stats):
        with pytest.raises(RuntimeError, match="npusim has no caching pinned-host allocator"):
            call()
