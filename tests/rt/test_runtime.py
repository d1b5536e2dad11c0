"""rt host API on in-process cards: devices, visibility, memory, memory checking, copies, tensors.

Oracles are numpy (copies must be bit-exact) and hand-computed expectations (codes, capacities).
"""

import threading

import numpy as np
import pytest

import rt

pytestmark = pytest.mark.timeout(60, method="signal")   # a hang fails the test; teardown still runs

KiB, MiB = 1 << 10, 1 << 20
INVALID_PARAM, RT_PARAM, INVALID_DEVICE, CONTEXT_NULL = 100000, 107000, 107001, 107002
OOM, FREE_FAIL = 207001, 207002
H2H, H2D, D2H, D2D, DEFAULT = 0, 1, 2, 3, 4


def raises(code, fn, *args, **kwargs) -> str:
    """Call fn, expect an AclError with ``code``; return its message."""
    with pytest.raises(rt.AclError) as info:
        fn(*args, **kwargs)
    assert info.value.code == code, info.value
    return info.value.message


def upload(data: np.ndarray) -> int:
    ptr = rt.malloc(data.nbytes)
    rt.memcpy(ptr, data.nbytes, data, data.nbytes, H2D)
    return ptr


def download(ptr: int, nbytes: int) -> np.ndarray:
    out = np.empty(nbytes, np.uint8)
    rt.memcpy(out, nbytes, ptr, nbytes, D2H)
    return out


def random_bytes(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def card_works() -> None:
    """The current card still allocates, copies and frees correctly (after an error)."""
    data = random_bytes(4096, seed=99)
    ptr = upload(data)
    assert np.array_equal(download(ptr, data.nbytes), data)
    rt.free(ptr)


# ====================================================================== devices
def test_device_count_info_and_soc(rt_local):
    assert rt.get_device_count() == 8
    assert rt.get_soc_name() == "Ascend910B1"
    info = rt.get_device_info(3)
    assert (info.name, info.soc_name, info.total_memory) == ("npu:0:3", "Ascend910B1", 2 << 30)
    assert info.physical_id == 3


def test_set_get_device_is_per_thread(rt_local):
    rt.set_device(2)
    seen = {}

    def other():
        try:
            rt.get_device()
        except rt.AclError as e:
            seen["before"] = e.code
        rt.set_device(5)
        seen["after"] = rt.get_device()

    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert seen == {"before": CONTEXT_NULL, "after": 5}
    assert rt.get_device() == 2


def test_reset_device_reference_counting(rt_local):
    rt.set_device(1)
    rt.set_device(1)
    ptr = rt.malloc(MiB)
    rt.reset_device(1)                       # count 2 -> 1: still usable
    assert rt.get_device() == 1
    rt.memset(ptr, MiB, 7, MiB)
    rt.reset_device(1)                       # count 0: context released
    raises(CONTEXT_NULL, rt.get_device)
    raises(INVALID_DEVICE, rt.reset_device, 1)
    rt.set_device(1)
    assert rt.get_mem_info() == (2 << 30, 2 << 30)   # the allocation went with the context


def test_reset_device_force_ignores_count(rt_local):
    for _ in range(3):
        rt.set_device(0)
    rt.malloc(MiB)
    rt.reset_device_force(0)
    raises(CONTEXT_NULL, rt.malloc, 16)
    raises(INVALID_DEVICE, rt.reset_device, 0)
    rt.set_device(0)
    assert rt.get_mem_info()[0] == 2 << 30


@pytest.mark.parametrize("bad", [8, -1, 100, "0", 1.0, True])
def test_invalid_device_ids(rt_local, bad):
    for fn in (rt.set_device, rt.get_device_info):
        msg = raises(INVALID_DEVICE, fn, bad)
        assert repr(bad) in msg and "0..7" in msg


def test_get_mem_info_before_set_device(rt_local):
    raises(CONTEXT_NULL, rt.get_mem_info)
    raises(CONTEXT_NULL, rt.malloc, 64)


def test_calls_before_init_fail():
    assert not rt.is_initialized()
    raises(100001, rt.get_device_count)
    raises(100001, rt.set_device, 0)


def test_a_launched_rank_told_local_cards_is_refused_at_once(monkeypatch, tmp_path):
    # NPUSIM_BACKEND=local left in a launched job's environment: each rank's cards of its own would never meet the
    # other ranks' (comm init would time out after HCCL_CONNECT_TIMEOUT); init says so and what to do
    monkeypatch.setenv("NPUSIM_BACKEND", "local")
    monkeypatch.setenv("NPUSIM_CARD_DIR", str(tmp_path))
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(rt.NpuError) as e:
        rt.init()
    msg = str(e.value)
    assert e.value.code == 100000 and not rt.is_initialized()
    assert "rank 2 of a launched job of 4 ranks" in msg and str(tmp_path) in msg and "unset NPUSIM_BACKEND" in msg
    rt.init(backend="local")                # asked for by the program itself: its own cards, as it said
    rt.finalize()
    monkeypatch.setenv("WORLD_SIZE", "1")   # a job of one rank meets nobody: its own cards are fine
    rt.init()
    assert rt.get_device_count() == 8
    rt.finalize()


@pytest.mark.parametrize("text, physical", [
    ("1,2,3", [1, 2, 3]),
    ("1, 2,3", [1]),          # CANN stops parsing at the first malformed entry
    ("3,1", [3]),             # ... and at the first id not above the previous one
    ("0,7", [0, 7]),
    ("7,8", [7]),             # 8 does not exist on an 8-card node
    ("", []),
])
def test_visible_devices_filter_and_renumber(rt_factory, text, physical):
    rt_factory(visible=text)
    assert rt.get_device_count() == len(physical)
    assert [rt.get_device_info(i).physical_id for i in range(len(physical))] == physical
    msg = raises(INVALID_DEVICE, rt.set_device, len(physical))
    assert "ASCEND_RT_VISIBLE_DEVICES" in msg


def test_visible_device_zero_is_the_physical_card(rt_factory):
    rt_factory(visible="1,2,3")
    rt.set_device(0)
    ptr = rt.malloc(64)
    assert rt.get_device_info(0).name == "npu:0:1"
    assert (ptr >> 44) & 0xFF == 1          # the address encodes physical card 1
    rt.free(ptr)


def test_peer_access_queries(rt_local):
    assert rt.device_can_access_peer(0, 1) and not rt.device_can_access_peer(2, 2)
    raises(INVALID_DEVICE, rt.device_can_access_peer, 0, 8)
    rt.set_device(0)
    rt.device_enable_peer_access(1)
    raises(INVALID_PARAM, rt.device_enable_peer_access, 0)


# ====================================================================== memory
def test_malloc_free_and_mem_info(dev0):
    free0, total = rt.get_mem_info()
    assert free0 == total == 2 << 30
    ptrs = [rt.malloc(n) for n in (1, 100, 64 * KiB, 3 * MiB)]
    assert all(p % 64 == 0 for p in ptrs)
    assert len(set(ptrs)) == 4
    assert rt.get_mem_info()[0] < free0
    for p in ptrs:
        rt.free(p)
    stats = rt.memory_stats()
    assert stats["allocated_bytes.all.current"] == 0
    assert stats["allocation.all.allocated"] == stats["allocation.all.freed"] == 4


def test_oom_names_the_numbers(rt_factory, small_config):
    rt_factory(config=small_config)
    rt.set_device(0)
    assert rt.get_mem_info() == (8 * MiB, 8 * MiB)
    big = rt.malloc(6 * MiB)
    msg = raises(OOM, rt.malloc, 4 * MiB)
    for word in ("requested 4194304", "allocated", "reserved", "capacity 8388608"):
        assert word in msg
    stats = rt.memory_stats()
    assert stats["num_ooms"] == 1 and stats["num_alloc_retries"] == 1
    rt.free(big)
    card_works()
    ok = rt.malloc(4 * MiB)                  # fits once the first block is gone
    rt.free(ok)
    rt.empty_cache()
    assert rt.get_mem_info()[0] == 8 * MiB
    assert rt.memory_stats()["reserved_bytes.all.current"] == 0


@pytest.mark.parametrize("size", [0, -5, 1.5, "10", None, True])
def test_bad_malloc_sizes(dev0, size):
    raises(INVALID_PARAM, rt.malloc, size)
    card_works()


@pytest.mark.parametrize("policy", [99, -1, 8, 0x200])
def test_bad_malloc_policy(dev0, policy):
    raises(INVALID_PARAM, rt.malloc, 1024, policy)
    card_works()


@pytest.mark.parametrize("policy", [rt.ACL_MEM_MALLOC_HUGE_FIRST, rt.ACL_MEM_MALLOC_HUGE_ONLY,
                                    rt.ACL_MEM_MALLOC_NORMAL_ONLY,
                                    rt.ACL_MEM_MALLOC_NORMAL_ONLY | rt.ACL_MEM_TYPE_HIGH_BAND_WIDTH])
def test_good_malloc_policies(dev0, policy):
    rt.free(rt.malloc(1024, policy))


def test_double_free_and_use_after_free(dev0):
    ptr = rt.malloc(1000)
    rt.free(ptr)
    msg = raises(FREE_FAIL, rt.free, ptr)
    assert f"{ptr:#x}" in msg and "1000 bytes" in msg
    msg = raises(RT_PARAM, rt.memcpy, np.zeros(10, np.uint8), 10, ptr, 10, D2H)
    assert "use after free" in msg and f"{ptr:#x}" in msg
    raises(RT_PARAM, rt.memcpy, ptr + 16, 10, b"0123456789", 10, H2D)
    raises(RT_PARAM, rt.memset, ptr, 10, 0, 10)
    card_works()
    assert rt.malloc(1000) != ptr            # virtual addresses are never reused


def test_out_of_bounds_copies(dev0):
    ptr = rt.malloc(1024)
    msg = raises(RT_PARAM, rt.memcpy, np.zeros(2000, np.uint8), 2000, ptr, 2000, D2H)
    assert "out of bounds" in msg and "1024 bytes" in msg
    raises(RT_PARAM, rt.memcpy, np.zeros(100, np.uint8), 100, ptr + 1000, 100, D2H)
    raises(RT_PARAM, rt.memcpy, ptr + 1020, 8, np.zeros(8, np.uint8), 8, H2D)
    raises(RT_PARAM, rt.memset, ptr + 512, 1024, 1, 1024)
    # in bounds at the very end is fine
    rt.memcpy(ptr + 1016, 8, np.arange(8, dtype=np.uint8), 8, H2D)
    assert np.array_equal(download(ptr + 1016, 8), np.arange(8))
    card_works()


def test_foreign_pointer_of_another_card(rt_local):
    rt.set_device(1)
    p1 = rt.malloc(4096)
    rt.set_device(0)
    msg = raises(FREE_FAIL, rt.free, p1)
    assert "card 1" in msg
    card_works()
    rt.set_device(1)
    rt.free(p1)                               # its own card still frees it


@pytest.mark.parametrize("garbage", [0, 12345, 1 << 62, -1])
def test_garbage_integers(dev0, garbage):
    raises(RT_PARAM, rt.free, garbage)
    msg = raises(RT_PARAM, rt.memcpy, garbage, 10, np.zeros(10, np.uint8), 10, H2D)
    assert "not a device address" in msg
    raises(RT_PARAM, rt.memcpy, np.zeros(10, np.uint8), 10, garbage, 10, DEFAULT)
    raises(RT_PARAM, rt.memset, garbage, 10, 0, 10)
    card_works()


def test_memory_stats_keys(dev0):
    stats = rt.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
                "reserved_bytes.all.peak", "active_bytes.all.current", "num_alloc_retries", "num_ooms",
                "allocation.all.current", "segment.all.current"):
        assert key in stats, key
    p = rt.malloc(3 * MiB)
    stats = rt.memory_stats(0)
    assert stats["allocated_bytes.all.current"] >= 3 * MiB
    assert stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"]
    rt.free(p)
    raises(CONTEXT_NULL, rt.memory_stats, 4)  # device 4 is not set in this process


def test_empty_cache_returns_cached_segments(dev0):
    ptrs = [rt.malloc(3 * MiB) for _ in range(3)]
    for p in ptrs:
        rt.free(p)
    assert rt.memory_stats()["reserved_bytes.all.current"] > 0
    assert rt.get_mem_info()[0] < 2 << 30
    rt.empty_cache()
    assert rt.memory_stats()["reserved_bytes.all.current"] == 0
    assert rt.get_mem_info()[0] == 2 << 30


def test_reset_device_frees_everything_of_the_process(rt_local):
    rt.set_device(0)
    for n in (100, 64 * KiB, 5 * MiB):
        rt.malloc(n)
    s = rt.create_stream()
    rt.memset_async(rt.malloc(KiB), KiB, 1, KiB, s)
    assert rt.get_mem_info()[0] < 2 << 30
    rt.reset_device(0)
    rt.set_device(0)
    assert rt.get_mem_info() == (2 << 30, 2 << 30)


def test_malloc_host_and_free_host(rt_local):
    buf = rt.malloc_host(4096)
    view = np.frombuffer(buf, np.uint32)
    view[:] = np.arange(1024)
    assert buf.nbytes == 4096 and bytes(buf[:4]) == b"\x00\x00\x00\x00"
    del view
    rt.free_host(buf)
    with pytest.raises(rt.AclError):
        rt.free_host(buf)
    raises(INVALID_PARAM, rt.free_host, bytearray(10))
    raises(INVALID_PARAM, rt.malloc_host, 0)


# ====================================================================== copies
@pytest.mark.parametrize("nbytes", [1, 100, 64 * KiB, 64 * KiB + 1, 4 * MiB + 3])
@pytest.mark.parametrize("kind", [H2D, DEFAULT, rt.ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE])
def test_round_trip_sizes(dev0, nbytes, kind):
    data = random_bytes(nbytes, seed=nbytes)
    ptr = rt.malloc(nbytes)
    rt.memcpy(ptr, nbytes, data, nbytes, kind)
    back = np.empty(nbytes, np.uint8)
    rt.memcpy(back, nbytes, ptr, nbytes, D2H if kind != DEFAULT else DEFAULT)
    assert np.array_equal(back, data)
    rt.free(ptr)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8, rt.BFLOAT16, np.complex64])
def test_host_numpy_dtypes_bit_exact(dev0, dtype):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(1000).astype(dtype)
    ptr = upload(a)
    b = np.zeros_like(a)
    rt.memcpy(b, b.nbytes, ptr, a.nbytes, D2H)
    assert a.tobytes() == b.tobytes()


def test_host_side_types(dev0):
    data = random_bytes(3000, seed=5)
    ptr = rt.malloc(3000)
    for src in (data.tobytes(), bytearray(data.tobytes()), memoryview(data.tobytes()),
                memoryview(data.reshape(30, 100))):
        rt.memset(ptr, 3000, 0, 3000)
        rt.memcpy(ptr, 3000, src, 3000, H2D)
        assert np.array_equal(download(ptr, 3000), data)
    for make in (lambda: bytearray(3000), lambda: memoryview(bytearray(3000)), lambda: np.zeros(750, np.float32)):
        dst = make()
        rt.memcpy(dst, 3000, ptr, 3000, D2H)
        assert bytes(memoryview(dst).cast("B")) == data.tobytes()
    msg = raises(INVALID_PARAM, rt.memcpy, b"\0" * 3000, 3000, ptr, 3000, D2H)
    assert "bytes" in msg and "read-only" in msg
    raises(INVALID_PARAM, rt.memcpy, np.zeros(10)[::2], 40, ptr, 40, D2H)       # not contiguous
    raises(INVALID_PARAM, rt.memcpy, ptr, 3000, [1, 2, 3], 3, H2D)             # not a buffer
    card_works()


def test_host_buffer_and_offset_views(dev0):
    buf = rt.malloc_host(MiB)
    whole = np.frombuffer(buf, np.uint8)
    whole[:] = random_bytes(MiB, seed=7)
    ptr = rt.malloc(MiB)
    rt.memcpy(ptr, MiB, buf, MiB, H2D)
    assert np.array_equal(download(ptr, MiB), whole)
    # a view at an offset into the pinned buffer, as source and as destination
    view = np.frombuffer(buf, np.float32, count=1000, offset=4096)
    view[:] = np.arange(1000, dtype=np.float32)
    rt.memcpy(ptr + 128, view.nbytes, view, view.nbytes, H2D)
    assert np.array_equal(download(ptr + 128, 4000).view(np.float32), np.arange(1000, dtype=np.float32))
    out = whole[8192:8192 + 4000]
    rt.memcpy(out, 4000, ptr + 128, 4000, D2H)
    assert np.array_equal(out.view(np.float32), np.arange(1000, dtype=np.float32))
    del whole, view, out
    rt.free(ptr)
    rt.free_host(buf)


def test_count_and_dst_max_checks(dev0):
    ptr = rt.malloc(1024)
    msg = raises(INVALID_PARAM, rt.memcpy, ptr, 10, np.zeros(100, np.uint8), 100, H2D)
    assert "count 100 exceeds dst_max 10" in msg
    raises(INVALID_PARAM, rt.memcpy, ptr, 1024, np.zeros(10, np.uint8), 100, H2D)  # host src too small
    raises(INVALID_PARAM, rt.memcpy, np.zeros(10, np.uint8), 100, ptr, 100, D2H)  # host dst too small
    raises(INVALID_PARAM, rt.memcpy, ptr, 1024, np.zeros(8, np.uint8), -1, H2D)
    raises(INVALID_PARAM, rt.memset, ptr, 10, 0, 11)
    raises(INVALID_PARAM, rt.memset, ptr, 10, 256, 10)
    rt.memcpy(ptr, 1024, np.zeros(0, np.uint8), 0, H2D)                        # count 0 is a no-op
    card_works()


@pytest.mark.parametrize("kind, dst_dev, src_dev", [
    (H2D, False, True), (D2H, True, False), (D2D, False, True), (D2D, True, False), (H2D, True, True),
    (rt.ACL_MEMCPY_INNER_DEVICE_TO_DEVICE, True, False), (9, True, False),
])
def test_kind_mismatch(dev0, kind, dst_dev, src_dev):
    ptr = rt.malloc(64)
    host = np.zeros(64, np.uint8)
    dst = ptr if dst_dev else host
    src = ptr if src_dev else np.ones(64, np.uint8)
    raises(INVALID_PARAM, rt.memcpy, dst, 64, src, 64, kind)
    card_works()


def test_default_kind_infers_every_direction(dev0):
    a, b = random_bytes(5000, 1), random_bytes(5000, 2)
    p, q = rt.malloc(5000), rt.malloc(5000)
    rt.memcpy(p, 5000, a, 5000, DEFAULT)
    rt.memcpy(q, 5000, p, 5000, DEFAULT)
    out = np.zeros(5000, np.uint8)
    rt.memcpy(out, 5000, q, 5000, DEFAULT)
    assert np.array_equal(out, a)
    rt.memcpy(out, 5000, b, 5000, DEFAULT)          # host to host
    assert np.array_equal(out, b)
    raises(INVALID_PARAM, rt.memcpy_async, out, 5000, b, 5000, DEFAULT, None)  # async H2H is refused


def test_device_to_device_within_and_between_cards(rt_local):
    data = random_bytes(3 * MiB + 5, seed=3)
    rt.set_device(0)
    a = upload(data)
    b = rt.malloc(data.nbytes)
    rt.memcpy(b, data.nbytes, a, data.nbytes, rt.ACL_MEMCPY_INNER_DEVICE_TO_DEVICE)
    rt.set_device(1)
    c = rt.malloc(data.nbytes)
    rt.memcpy(c, data.nbytes, b, data.nbytes, rt.ACL_MEMCPY_INTER_DEVICE_TO_DEVICE)   # card 0 -> card 1
    assert np.array_equal(download(c, data.nbytes), data)
    rt.set_device(0)
    d = rt.malloc(data.nbytes)
    s = rt.create_stream()
    rt.memcpy_async(d, data.nbytes, c, data.nbytes, D2D, s)                          # card 1 -> card 0
    rt.synchronize_stream(s)
    assert np.array_equal(download(d, data.nbytes), data)


def test_memset_and_memset_async(dev0):
    ptr = rt.malloc(10000)
    rt.memset(ptr, 10000, 0xAB, 10000)
    s = rt.create_stream()
    rt.memset_async(ptr + 100, 9900, 0x01, 50, s)
    rt.memset_async(ptr + 9000, 1000, 0xFF, 1000, s)
    rt.synchronize_stream(s)
    expected = np.full(10000, 0xAB, np.uint8)
    expected[100:150] = 1
    expected[9000:] = 0xFF
    assert np.array_equal(download(ptr, 10000), expected)
    raises(RT_PARAM, rt.memset_async, 42, 10, 0, 10, s)


@pytest.mark.parametrize("nbytes", [4096, 256 * KiB])
def test_pageable_async_source_captured_at_enqueue(dev0, nbytes):
    s = rt.create_stream()
    ptr = rt.malloc(nbytes)
    src = random_bytes(nbytes, seed=11)
    old = src.copy()
    rt.sleep_kernel(0.2, s)                 # the copy cannot have run when we mutate the source
    rt.memcpy_async(ptr, nbytes, src, nbytes, H2D, s)
    src[:] = 0
    rt.synchronize_stream(s)
    assert np.array_equal(download(ptr, nbytes), old)


@pytest.mark.parametrize("nbytes", [4096, 256 * KiB])
def test_pageable_async_destination_filled_by_sync(dev0, nbytes):
    s = rt.create_stream()
    data = random_bytes(nbytes, seed=12)
    ptr = upload(data)
    dst = np.zeros(nbytes, np.uint8)
    rt.sleep_kernel(0.1, s)
    rt.memcpy_async(dst, nbytes, ptr, nbytes, D2H, s)
    rt.synchronize_stream(s)
    assert np.array_equal(dst, data)


def test_pinned_async_round_trip(dev0):
    buf = rt.malloc_host(4 * MiB)
    host = np.frombuffer(buf, np.uint8)
    host[:] = random_bytes(4 * MiB, seed=13)
    expected = host.copy()
    ptr = rt.malloc(4 * MiB)
    s = rt.create_stream()
    rt.memcpy_async(ptr, 4 * MiB, buf, 4 * MiB, H2D, s)
    out = rt.malloc_host(4 * MiB)
    rt.memcpy_async(out, 4 * MiB, ptr, 4 * MiB, D2H, s)
    rt.synchronize_stream(s)
    assert np.array_equal(np.frombuffer(out, np.uint8), expected)
    del host
    rt.free_host(buf)
    rt.free_host(out)


# ====================================================================== tensors and kernels
@rt.kernel
def axpy(x, y, out, *, alpha):
    """A user kernel defined in the test module: out = alpha * x + y."""
    out[...] = alpha * x + y


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int8, np.float64, rt.BFLOAT16, np.bool_])
def test_tensor_numpy_round_trip(dev0, dtype):
    a = (np.random.default_rng(2).standard_normal((7, 5, 3)) * 10).astype(dtype)
    t = rt.Tensor.from_numpy(a)
    assert (t.shape, t.dtype, t.nbytes) == (a.shape, np.dtype(dtype), a.nbytes)
    back = t.numpy()
    assert back.dtype == a.dtype and back.tobytes() == a.tobytes()
    t.free()
    raises(RT_PARAM, t.numpy)


def test_user_kernel_from_test_module(dev0):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.full((3, 4), 0.5, np.float32)
    tx, ty, out = rt.Tensor.from_numpy(x), rt.Tensor.from_numpy(y), rt.empty((3, 4), np.float32)
    rt.launch_kernel(axpy, [tx, ty], [out], {"alpha": 3.0})
    assert np.array_equal(out.numpy(), 3.0 * x + y)


def test_builtin_matmul_kernel(dev0):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((6, 5)).astype(np.float32)
    b = rng.standard_normal((5, 3)).astype(np.float32)
    ta, tb, out = rt.Tensor.from_numpy(a), rt.Tensor.from_numpy(b), rt.empty((6, 3), np.float32)
    rt.launch_kernel("MatMul", [ta, tb], [out])
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rt.ops.matmul(ta, tb).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    with pytest.raises(rt.AclError):
        rt.launch_kernel("MatMul", [ta, ta], [out])          # (6,5) @ (6,5): checked on the host


def test_launch_kernel_rejects_non_tensors(dev0):
    out = rt.empty(4, np.float32)
    raises(INVALID_PARAM, rt.launch_kernel, axpy, [np.zeros(4)], [out])
    raises(INVALID_PARAM, rt.launch_kernel, 42, [], [out])
