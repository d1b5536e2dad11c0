"""Device memory: aclrtMalloc rules, caching allocator, capacity, memory checking, stats, sharing."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rt.constants import ACL_MEM_TYPE_HIGH_BAND_WIDTH, MemMallocPolicy
from rt.errors import AclError
from rt.addresses import ADDR_TAG, decode_addr, make_addr
from rt.card.memory import VA_BASE, DeviceMemory
from rt.wire.segment import Segment

KiB, MiB = 1 << 10, 1 << 20
INVALID_PARAM, RT_PARAM, OOM, FREE_FAIL = 100000, 107000, 207001, 207002


@pytest.fixture
def mem():
    m = DeviceMemory(node=0, card=0, capacity=64 * MiB)
    yield m
    m.close()


def raises(code, fn, *args, **kwargs) -> str:
    """Call fn, expect AclError with `code`, return its message."""
    with pytest.raises(AclError) as info:
        fn(*args, **kwargs)
    assert info.value.code == code, info.value
    return info.value.message


# ---- addresses ---------------------------------------------------------------------------------

def test_make_and_decode_addr():
    ptr = make_addr(3, 5, 12345)
    assert ptr == ADDR_TAG | 3 << 52 | 5 << 44 | 12345
    assert decode_addr(ptr) == (3, 5)
    assert decode_addr(np.uint64(ptr)) == (3, 5)
    for junk in (0, 12345, 0x7F12_3456_7000, -ptr, ptr << 1, "0x10", 1.5, None):
        assert decode_addr(junk) is None
    raises(RT_PARAM, make_addr, 0, 0, 1 << 44)
    raises(RT_PARAM, make_addr, 256, 0, 0)


def test_addresses_encode_card_and_node():
    m = DeviceMemory(node=2, card=7, capacity=8 * MiB)
    assert decode_addr(m.malloc(10)) == (2, 7)
    m.close()


# ---- aclrtMalloc rules ---------------------------------------------------------------------------

@pytest.mark.parametrize("size, rounded", [(1, 64), (31, 64), (32, 64), (33, 96), (100, 160),
                                           (4096, 4128), (MiB, MiB + 32)])
def test_size_rounding_and_alignment(mem, size, rounded):
    ptr = mem.malloc(size)
    alloc = mem.allocation(ptr)
    assert (alloc.start, alloc.size, alloc.rounded) == (ptr, size, rounded)
    assert ptr % 64 == 0
    assert mem.stats()["requested_bytes.all.current"] == size
    assert mem.stats()["allocated_bytes.all.current"] == -(-rounded // 512) * 512


@pytest.mark.parametrize("size", [0, -1, 1.5, "10", True, None])
def test_malloc_rejects_bad_size(mem, size):
    msg = raises(INVALID_PARAM, mem.malloc, size)
    assert repr(size) in msg and "positive int" in msg


@pytest.mark.parametrize("policy", [8, -1, 0x200, 2 | 0x200, "x", 1.0])
def test_malloc_rejects_bad_policy(mem, policy):
    msg = raises(INVALID_PARAM, mem.malloc, 64, policy)
    assert repr(policy) in msg and "ACL_MEM_MALLOC_NORMAL_ONLY=2" in msg


def test_policy_with_flags_is_recorded(mem):
    for policy in list(MemMallocPolicy) + [2 | ACL_MEM_TYPE_HIGH_BAND_WIDTH, 0x100000]:
        assert mem.allocation(mem.malloc(64, policy)).policy == policy


def test_virtual_addresses_never_reused_with_guard_gaps(mem):
    seen, last_end = set(), 0
    for i in range(10_000):
        size = 1 + (i * 37) % 5000
        ptr = mem.malloc(size)
        assert ptr not in seen and ptr >= last_end + 64
        seen.add(ptr)
        last_end = ptr + mem.allocation(ptr).rounded
        mem.free(ptr)
    # the physical block was reused throughout: one small segment
    assert mem.stats()["segment.all.allocated"] == 1


def test_virtual_space_wraps_around_live_allocations_only():
    m = DeviceMemory(node=0, card=0, capacity=8 * MiB, va_size=VA_BASE + 64 * KiB)
    live = [m.malloc(1000)]                  # the first one stays live across every wrap
    history = []
    for i in range(100):                     # 64 KiB holds ~32 such ranges: wraps ~3 times
        p = m.malloc(1000)
        m.view(p, 1000)[:] = i % 256         # a reused range is an ordinary live allocation
        history.append(p)
        live.append(p)
        starts = sorted(live)
        for a, b in zip(starts, starts[1:]):
            assert b >= a + m.allocation(a).rounded + 64, "live ranges overlap after wrap"
        if len(live) > 3:
            m.free(live.pop(1))
    assert len(set(history)) < len(history)  # the wrap did reuse dead ranges
    assert live[0] not in history            # but never a live one
    before = m.stats()
    msg = raises(OOM, m.malloc, 80 * KiB)    # can never fit in the address space
    assert "virtual address space" in msg
    after = m.stats()                        # the physical block went back untouched
    for key in ("allocated_bytes.all.current", "active.all.current", "inactive_split.all.current"):
        assert after[key] == before[key], key
    m.close()


# ---- caching allocator ------------------------------------------------------------------------

def test_split_then_merge_serves_larger_request_from_same_segment(mem):
    a, b, c, d = (mem.malloc(400 * KiB) for _ in range(4))
    seg, off_a = mem.locate(a, 0)
    assert [mem.locate(p, 0) for p in (b, c, d)] == [(seg, off_a + k * 410112) for k in (1, 2, 3)]
    mem.free(b)
    mem.free(a)       # merged with b: 820224 contiguous bytes at offset 0
    e = mem.malloc(800 * KiB)  # block 819712 fits only the merged hole (the tail is 456704)
    assert mem.locate(e, 0) == (seg, off_a)
    stats = mem.stats()
    assert stats["segment.all.current"] == 1 and stats["num_device_alloc"] == 1
    for p in (c, d, e):
        mem.free(p)
    assert mem.stats()["inactive_split.all.current"] == 0  # everything merged back to one block
    mem.empty_cache()
    assert mem.stats()["segment.all.current"] == 0 and mem.mem_info() == (64 * MiB, 64 * MiB)


def test_pool_and_segment_sizes(mem):
    mem.malloc(MiB - 32)                    # block exactly 1 MiB: small pool, 2 MiB segment
    mem.malloc(11 * MiB)                    # own segment rounded to 2 MiB: 12 MiB, unsplit
    mem.malloc(MiB)                         # 1 MiB + 512: large pool, 20 MiB segment
    mem.malloc(11 * MiB)                    # best fit: the rest of that 20 MiB segment
    s = mem.stats()
    assert s["reserved_bytes.small_pool.current"] == 2 * MiB
    assert s["reserved_bytes.large_pool.current"] == 32 * MiB
    assert s["segment.large_pool.current"] == 2
    assert s["allocated_bytes.large_pool.current"] == 12 * MiB + MiB + 512 + 11 * MiB + 512
    assert mem.mem_info() == (30 * MiB, 64 * MiB)


def test_out_of_memory_message_and_code():
    m = DeviceMemory(node=0, card=3, capacity=8 * MiB)
    p = m.malloc(3 * MiB)                   # a 20 MiB segment cannot fit: tight 4 MiB one
    m.malloc(1000)                          # 2 MiB small segment
    msg = raises(OOM, m.malloc, 3 * MiB)
    block = 3 * MiB + 512
    assert msg == (f"EL0004: Failed to allocate memory. malloc: out of memory on card 3 (node 0): "
                   f"requested {3 * MiB} bytes (rounded {3 * MiB + 32}); allocated {4 * MiB + 1536}, reserved {6 * MiB} "
                   f"(cached {2 * MiB - 1536}), capacity {8 * MiB}")
    assert block < 4 * MiB  # the whole 4 MiB block went to p: rest under 1 MiB is not split
    s = m.stats()
    assert (s["num_ooms"], s["num_alloc_retries"]) == (1, 1)
    raises(OOM, m.malloc, 9 * MiB)          # bigger than the card
    assert f"requested {1 << 62} bytes" in raises(OOM, m.malloc, 1 << 62)
    m.free(p)
    m.malloc(3 * MiB)                       # the cached block serves it
    assert m.stats()["num_ooms"] == 3
    m.close()


def test_retry_after_releasing_cached_segments():
    m = DeviceMemory(node=0, card=0, capacity=4 * MiB)
    m.free(m.malloc(1000))                  # leaves a cached 2 MiB small segment
    p = m.malloc(3 * MiB)                   # needs 3 MiB+512: fits only once the cache is gone
    s = m.stats()
    assert (s["num_alloc_retries"], s["num_ooms"], s["num_sync_all_streams"]) == (1, 0, 1)
    assert (s["num_device_alloc"], s["num_device_free"]) == (2, 1)
    assert s["reserved_bytes.all.current"] == 4 * MiB
    m.view(p, 3 * MiB)[-1] = 5
    m.close()


# ---- deferred reuse ------------------------------------------------------------------------------

def test_busy_block_is_not_reused_until_work_is_done(mem):
    busy = [True]
    p = mem.malloc(1000)
    where = mem.locate(p, 0)
    mem.free(p, busy=lambda: busy[0])
    assert "use after free" in raises(RT_PARAM, mem.view, p, 1)  # the VA is dead at once
    q = mem.malloc(1000)
    assert mem.locate(q, 0) != where
    s = mem.stats()
    assert (s["allocation.all.current"], s["active.all.current"]) == (1, 2)
    mem.free(q)
    mem.empty_cache()                       # the pending block pins its segment
    assert mem.stats()["segment.all.current"] == 1
    busy[0] = False
    r = mem.malloc(1000)                    # malloc polls pending blocks: p's block is back
    assert mem.locate(r, 0) == where
    mem.free(r)
    mem.empty_cache()
    assert mem.stats()["segment.all.current"] == 0


def test_busy_callable_that_raises_counts_as_done(mem):
    p = mem.malloc(1000)
    where = mem.locate(p, 0)
    mem.free(p, busy=lambda: 1 / 0)
    assert mem.locate(mem.malloc(1000), 0) == where


# ---- memory checking: access -----------------------------------------------------------------------

@pytest.mark.parametrize("junk", [0, 12345, 0x7F12_3456_7000, -1, "ptr", 1.5, None])
def test_access_to_non_device_pointer(mem, junk):
    mem.malloc(64)
    for call in (lambda: mem.view(junk, 4), lambda: mem.locate(junk, 4),
                 lambda: mem.typed_view(junk, (1,), np.float32), lambda: mem.allocation(junk)):
        assert "is not a device address" in raises(RT_PARAM, call)


def test_access_to_other_card_or_node(mem):
    msg = raises(RT_PARAM, mem.view, make_addr(0, 1, VA_BASE), 4)
    assert "belongs to card 1 of node 0, not to card 0 of node 0" in msg
    msg = raises(RT_PARAM, mem.view, make_addr(2, 0, VA_BASE), 4)
    assert f"0x{make_addr(2, 0, VA_BASE):x}" in msg and "card 0 of node 2" in msg


def test_use_after_free(mem):
    p = mem.malloc(256, owner="proc-7")
    mem.free(p)
    msg = raises(RT_PARAM, mem.view, p + 16, 8, what="memcpy")
    assert msg.startswith("memcpy: use after free")
    assert f"0x{p + 16:x}" in msg and f"freed allocation 0x{p:x} of 256 bytes" in msg
    assert "'proc-7'" in msg and "8 bytes" in msg
    raises(RT_PARAM, mem.allocation, p)


def test_access_in_guard_gap_names_nearest_allocation(mem):
    p = mem.malloc(100, owner="me")
    gap = p + mem.allocation(p).rounded + 8
    msg = raises(RT_PARAM, mem.view, gap, 4)
    assert "in no allocation" in msg and f"0x{gap:x}" in msg
    assert f"nearest is live allocation 0x{p:x} of 100 bytes (owner 'me')" in msg
    below = make_addr(0, 0, VA_BASE - 64)
    assert f"0x{p:x}" in raises(RT_PARAM, mem.view, below, 4)


def test_out_of_bounds_checks_requested_size(mem):
    p = mem.malloc(100)                     # rounded to 160, but only 100 are the user's
    mem.view(p, 100)
    msg = raises(RT_PARAM, mem.view, p, 108, what="memset")
    assert msg.startswith("memset: out of bounds") and "8 bytes past the end" in msg
    assert f"0x{p:x} of 100 bytes" in msg and "108 bytes" in msg
    assert "4 bytes past" in raises(RT_PARAM, mem.view, p + 96, 8)
    assert "40 bytes past" in raises(RT_PARAM, mem.typed_view, p, (5, 7), np.float32)
    assert "1 bytes past" in raises(RT_PARAM, mem.locate, p + 100, 1)


def test_size_checks(mem):
    p = mem.malloc(100)
    assert "size -1" in raises(RT_PARAM, mem.view, p, -1)
    assert mem.view(p, 0).size == 0
    assert mem.view(p + 100, 0).size == 0   # one past the end, like C
    assert "shape" in raises(RT_PARAM, mem.typed_view, p, (-1, 2), np.float32)
    assert "shape" in raises(RT_PARAM, mem.typed_view, p, 2.5, np.float32)


# ---- memory checking: free -----------------------------------------------------------------------------

def test_double_free(mem):
    p = mem.malloc(300)
    mem.free(p)
    msg = raises(FREE_FAIL, mem.free, p)
    assert f"double free of 0x{p:x} (allocation of 300 bytes" in msg and "freed earlier" in msg
    assert "inside freed allocation" in raises(FREE_FAIL, mem.free, p + 64)


def test_free_of_interior_garbage_and_foreign_pointers(mem):
    p = mem.malloc(300)
    msg = raises(FREE_FAIL, mem.free, p + 64)
    assert f"0x{p + 64:x} is at offset 64 inside live allocation 0x{p:x} of 300 bytes" in msg
    assert "not a device address" in raises(FREE_FAIL, mem.free, 0)
    assert "not a device address" in raises(FREE_FAIL, mem.free, "p")
    assert "belongs to card 4" in raises(FREE_FAIL, mem.free, make_addr(0, 4, VA_BASE))
    assert "never allocated" in raises(FREE_FAIL, mem.free, p + (1 << 30))
    mem.free(p)                             # the failed frees changed nothing


def test_free_of_another_owners_allocation(mem):
    p = mem.malloc(64, owner=("pid", 11))
    msg = raises(FREE_FAIL, mem.free, p, owner=("pid", 22))
    assert "('pid', 11)" in msg and "('pid', 22)" in msg and f"0x{p:x}" in msg
    mem.free(p, owner=("pid", 11))


def test_freed_record_is_bounded():
    m = DeviceMemory(node=0, card=0, capacity=8 * MiB, freed_history=8)
    ptrs = [m.malloc(64) for _ in range(20)]
    for p in ptrs:
        m.free(p)
    assert "double free" in raises(FREE_FAIL, m.free, ptrs[-1])
    assert "never allocated" in raises(FREE_FAIL, m.free, ptrs[0])  # forgotten, still caught
    m.close()


def test_numpy_integer_pointers(mem):
    p = mem.malloc(64)
    mem.view(np.uint64(p), np.int64(8))[:] = 3
    assert mem.view(p, 8).tolist() == [3] * 8
    mem.free(np.uint64(p))


# ---- ownership, teardown, stats ---------------------------------------------------------------------------

def test_free_owner(mem):
    mine = [mem.malloc(1000, owner="a"), mem.malloc(2000, owner="a"), mem.malloc(12 * MiB, owner="a")]
    theirs = mem.malloc(1000, owner="b")
    assert mem.stats()["segment.all.current"] == 2
    assert mem.free_owner("a") == 3
    for p in mine:
        assert "use after free" in raises(RT_PARAM, mem.view, p, 1)
    mem.view(theirs, 1000)                  # untouched
    s = mem.stats()                         # the 12 MiB segment went, the shared small one stays
    assert (s["segment.all.current"], s["reserved_bytes.all.current"]) == (1, 2 * MiB)
    assert mem.free_owner("a") == 0


def test_stats_match_hand_computed_values(mem):
    small = mem.malloc(1000)                # block 1536 of a 2 MiB small segment
    mem.malloc(3 * MiB)                     # block 3 MiB + 512 of a 20 MiB large segment
    mem.free(small)
    s = mem.stats()
    big, rest = 3 * MiB + 512, 17 * MiB - 512
    expect = {
        "allocation.all": (1, 2, 2, 1), "allocation.small_pool": (0, 1, 1, 1),
        "allocation.large_pool": (1, 1, 1, 0),
        "segment.all": (2, 2, 2, 0), "active.all": (1, 2, 2, 1),
        "allocated_bytes.all": (big, big + 1536, big + 1536, 1536),
        "allocated_bytes.small_pool": (0, 1536, 1536, 1536),
        "reserved_bytes.all": (22 * MiB, 22 * MiB, 22 * MiB, 0),
        "active_bytes.large_pool": (big, big, big, 0),
        "requested_bytes.all": (3 * MiB, 3 * MiB + 1000, 3 * MiB + 1000, 1000),
        "inactive_split.all": (1, 2, 2, 1),
        "inactive_split_bytes.all": (rest, rest + 2 * MiB - 1536, rest + 2 * MiB - 1536, 2 * MiB - 1536),
    }
    for key, values in expect.items():
        got = tuple(s[f"{key}.{field}"] for field in ("current", "peak", "allocated", "freed"))
        assert got == values, key
    assert (s["num_device_alloc"], s["num_device_free"], s["num_alloc_retries"], s["num_ooms"],
            s["num_sync_all_streams"]) == (2, 0, 0, 0, 0)
    mem.empty_cache()
    s = mem.stats()
    assert (s["segment.all.current"], s["segment.all.freed"], s["num_device_free"]) == (1, 1, 1)
    assert s["reserved_bytes.all.current"] == 20 * MiB and s["num_sync_all_streams"] == 1
    assert mem.mem_info() == (44 * MiB, 64 * MiB)


def test_close_releases_everything():
    m = DeviceMemory(node=0, card=0, capacity=64 * MiB)
    p = m.malloc(5000)
    m.malloc(12 * MiB)
    m.free(m.malloc(100), busy=lambda: True)
    m.close()
    assert m.mem_info() == (64 * MiB, 64 * MiB) and m.stats()["allocation.all.current"] == 0
    assert "use after free" in raises(RT_PARAM, m.view, p, 1)
    assert "closed" in raises(OOM, m.malloc, 10)
    m.close()


# ---- sharing ---------------------------------------------------------------------------------------------

def test_view_round_trip_through_a_second_mapping(mem):
    p = mem.malloc(4096)
    seg_id, offset = mem.locate(p, 4096)
    seg = mem.segment(seg_id)
    peer = Segment.attach(seg.fd, seg.size, seg_id=seg_id)
    assert peer.fd != seg.fd and peer.id == seg.id
    data = np.arange(1024, dtype=np.float32)
    mem.typed_view(p, (1024,), np.float32)[:] = data
    assert np.array_equal(peer.array[offset:offset + 4096].view(np.float32), data)
    peer.array[offset:offset + 8] = 0xAB
    assert mem.view(p, 8).tolist() == [0xAB] * 8
    peer.close()
    assert mem.view(p, 8).tolist() == [0xAB] * 8  # the owner's mapping is unaffected
    assert "no segment" in raises(RT_PARAM, mem.segment, 10**9)


def test_segment_close_is_idempotent_with_live_views():
    seg = Segment(1 << 16)
    view = seg.array[10:20]
    view[:] = 9
    seg.close()
    seg.close()
    assert seg.closed and seg.fd == -1
    assert view.tolist() == [9] * 10        # mapping lives until the view goes
    raises(INVALID_PARAM, Segment, 0)


# ---- concurrency and invariants ------------------------------------------------------------------------

def test_threads_share_one_memory(mem):
    errors = []

    def worker(k):
        try:
            for i in range(300):
                p = mem.malloc(64 + (i * k) % 3000, owner=k)
                mem.view(p, 64)[:] = k
                assert mem.view(p, 64).tolist() == [k] * 64
                mem.free(p, owner=k)
        except Exception as exc:  # surfaced below; a thread cannot fail the test itself
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert mem.stats()["allocation.all.current"] == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 3 * MiB), st.integers(0, 10**6)),
                max_size=60))
def test_allocator_invariants(ops):
    m = DeviceMemory(node=0, card=0, capacity=24 * MiB, prefault=False)
    live = {}
    for is_malloc, size, pick in ops:
        if is_malloc or not live:
            try:
                p = m.malloc(size)
            except AclError as exc:
                assert exc.code == OOM
                continue
            live[p] = size
            m.view(p, size)[[0, -1]] = p % 251
        else:
            p = sorted(live)[pick % len(live)]
            assert m.view(p, live.pop(p))[-1] == p % 251  # nobody else wrote into the block
            m.free(p)
        s = m.stats()
        assert s["reserved_bytes.all.current"] <= 24 * MiB
        assert s["requested_bytes.all.current"] == sum(live.values())
        spans = sorted((*m.locate(p, 0), m.allocation(p).rounded) for p in live)
        for (sa, oa, ra), (sb, ob, _) in zip(spans, spans[1:]):
            assert sa != sb or oa + ra <= ob, "physical blocks overlap"
    for p in list(live):
        m.free(p)
    m.empty_cache()
    s = m.stats()
    assert s["reserved_bytes.all.current"] == 0 and s["inactive_split.all.current"] == 0
    m.close()
