"""Warm card actors must not grow with the number of jobs they served (issue #21 item 11).

A warm card is reset between jobs by closing its ``CardServer`` and building a new one on the same socket
path; the old server's accept thread used to stay blocked in ``accept()`` forever (closing a listening
socket does not wake it on Linux), so every job left one more thread in each card actor.
"""

import time

import psutil
import pytest
import ray

from rt.ray import pool

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

JOBS = 6                        # a leak of one thread per job shows as +6; noise is at most +3


def tiny_job():
    import os

    import rt
    rt.init()
    rt.set_device(int(os.environ["DEVICE_ID"]))
    ptr = rt.malloc(4096)
    rt.free(ptr)
    return 0


def _card_pids() -> list[int]:
    with pool._lock:
        actors = [a for group in pool._idle.values() for cards in group for a in cards.actors]
    return ray.get([a.pid.remote() for a in actors], timeout=30)


def _threads(pids) -> dict[int, int]:
    return {pid: psutil.Process(pid).num_threads() for pid in pids}


def test_card_actor_threads_stay_flat_over_warm_jobs(npu_spawn):
    for _ in range(2):                          # warm up: lazily started pools (Ray, numpy) settle first
        npu_spawn(tiny_job, nproc=1)
    pids = _card_pids()
    assert pids, "no warm card set went back to the pool"
    before = _threads(pids)
    for _ in range(JOBS):
        npu_spawn(tiny_job, nproc=1)
    assert _card_pids() == pids                 # the same warm actors served every job
    deadline = time.monotonic() + 10            # a reset's last threads may still be finishing
    while True:
        after = _threads(pids)
        grown = {pid: (before[pid], after[pid]) for pid in pids if after[pid] > before[pid] + 3}
        if not grown or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not grown, f"card actor threads grew over {JOBS} warm jobs (pid: (before, after)): {grown}"
