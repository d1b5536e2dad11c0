"""Warm jobs: consecutive spawns in one Ray session reuse the node's card actors (reset in between) and fork
their ranks from a pre-imported server — and the second job observes nothing of the first."""

import os

import numpy as np
import pytest

import launcher
from rt.ray import pool

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def first_job():
    """Leave as much behind as a job can: memory with data in it, a stream with work, an event, a model, a
    communicator; report the addresses and the card's state."""
    import hccl
    import rt
    comm = hccl.init()
    ptr = rt.malloc(1 << 20)
    rt.memset(ptr, 1 << 20, 0xAB, 1 << 20)
    stream = rt.create_stream()
    rt.record_event(rt.create_event(), stream)
    t = rt.Tensor.from_numpy(np.ones(16, np.float32))
    comm.all_reduce(t)
    return {"ptr": ptr, "dir": os.environ["NPUSIM_CARD_DIR"], "pid": os.getpid(),
            "used": rt.get_mem_info()[1] - rt.get_mem_info()[0]}


def second_job(old_ptr):
    import hccl
    import rt
    rt.init()
    rt.set_device(int(os.environ["DEVICE_ID"]))
    free, total = rt.get_mem_info()
    stats = rt.memory_stats()
    try:                                               # the first job's address means nothing here
        rt.memcpy(np.zeros(16, np.uint8), 16, old_ptr, 16, rt.ACL_MEMCPY_DEVICE_TO_HOST)
        stale = "readable"
    except rt.NpuError as e:
        stale = e.code
    ptr = rt.malloc(1 << 20)
    back = np.empty(1 << 20, np.uint8)
    rt.memcpy(back, back.nbytes, ptr, back.nbytes, rt.ACL_MEMCPY_DEVICE_TO_HOST)
    comm = hccl.init()
    t = rt.Tensor.from_numpy(np.full(4, 2.0, np.float32))
    comm.all_reduce(t)
    return {"free": free, "total": total, "allocated": stats["allocated_bytes.all.current"],
            "allocs": stats["allocation.all.allocated"], "stale": stale, "ptr": ptr, "zeros": int(back.any()) == 0,
            "dir": os.environ["NPUSIM_CARD_DIR"], "sum": float(t.numpy()[0]), "pid": os.getpid()}


def test_a_second_job_on_warm_cards_observes_nothing_of_the_first(npu_spawn):
    first = npu_spawn(first_job, nproc=2)
    assert all(r["used"] > 0 for r in first)
    assert pool.idle_count() >= 1                   # the cards went back to the pool, reset
    second = npu_spawn(second_job, nproc=2, args=(first[0]["ptr"],))
    assert second[0]["dir"] == first[0]["dir"]       # the same card actors served both jobs
    for r, f in zip(second, first):
        assert r["free"] == r["total"], r            # no memory of the first job is held or cached
        assert r["allocated"] == 0 and r["allocs"] == 0, r     # statistics start from zero
        assert r["stale"] == 107000, r               # the old address is not an allocation any more
        assert r["ptr"] > f["ptr"], (hex(r["ptr"]), hex(f["ptr"]))   # fresh addresses, never the old ones
        assert r["zeros"], r                         # new memory holds nothing of the old data
        assert r["sum"] == 4.0                       # a new communicator works on the reset cards
    assert {r["pid"] for r in first}.isdisjoint(r["pid"] for r in second)   # fresh rank processes


def fail_on_rank_one():
    import hccl
    hccl.init()
    if int(os.environ["RANK"]) == 1:
        raise ValueError("rank one fails")
    return "ok"


def test_a_failed_job_still_returns_clean_cards(npu_spawn):
    with pytest.raises(launcher.LaunchError) as info:
        npu_spawn(fail_on_rank_one, nproc=2)
    assert "ValueError: rank one fails" in str(info.value)
    result = npu_spawn(second_job, nproc=8, args=(0x1000_0000_0010_0000,))
    assert all(r["allocated"] == 0 and r["sum"] == 16.0 for r in result), result
