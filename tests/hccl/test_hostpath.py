"""Small collectives run in the rank's own process (hccl/hostpath.py), against numpy, on real card actors.

Four card actors are started once for the module (as ``launch`` does); each test runs four rank
processes of ``tests/scripts/hostpath_rank.py`` that see one card each. Also unit tests, without Ray,
of the pieces: the host's view of its own device memory and the shared stream progress.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import uuid

import numpy as np
import pytest

import hccl

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "hostpath_rank.py"
N = 4
E_PARA = int(hccl.HcclResult.HCCL_E_PARA)


@pytest.fixture(scope="module")
def cards(ray_session):
    import ray

    from rt.ray import session
    from rt.config import load_config
    job = "hpath" + uuid.uuid4().hex[:8]
    sockets = os.path.join(session.socket_root(), job)
    handles = session.create_cards(job, 0, ray.get_runtime_context().get_node_id(), load_config(None), count=N,
                                   socket_dir=sockets)
    yield sockets
    session.destroy_cards(handles)


def _ranks(sockets, scenario, **env_extra):
    """Run the scenario on N rank processes; their JSON reports in rank order."""
    root = hccl.get_root_info().to_bytes().hex()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HCCL_", "NPUSIM_", "ASCEND_RT_", "RAY_ADDRESS"))}
    env.update(HCCL_EXEC_TIMEOUT="60", NPUSIM_CARD_DIR=sockets, NPUSIM_NODE="0",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    env.update(env_extra)
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), scenario, str(r), str(N), root], text=True,
                              env=dict(env, ASCEND_RT_VISIBLE_DEVICES=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(N)]
    reports = []
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=100)
            assert p.returncode == 0, f"rank {r} exited {p.returncode}: {err[-3000:]}"
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
    return reports


@pytest.mark.ray
def test_every_small_collective_on_the_host_path_equals_numpy(cards):
    reports = _ranks(cards, "all")
    for r, rep in enumerate(reports):
        assert rep["bad"] == [], (r, rep["bad"])
        assert rep["host"]["done"] > 0, rep        # it really ran here (hand-overs are allowed: 2 cores)


@pytest.mark.ray
def test_ranks_on_the_host_and_on_their_cards_interoperate(cards):
    reports = _ranks(cards, "mixed")
    for r, rep in enumerate(reports):
        assert rep["bad"] == [], (r, rep["bad"])
    assert all(rep["host"]["done"] == 0 for rep in reports[1::2])     # busy streams: the card did it
    assert sum(rep["host"]["done"] for rep in reports[0::2]) > 0


@pytest.mark.ray
def test_late_peer_hands_the_wait_over_to_the_card(cards):
    reports = _ranks(cards, "late", NPUSIM_HCCL_HOST_WAIT_MS="5")
    for r, rep in enumerate(reports):
        assert rep["bad"] == [], (r, rep["bad"])
    assert sum(rep["host"]["handed"] for rep in reports[1:]) >= 3, reports


@pytest.mark.ray
def test_a_peer_late_for_the_second_phase_of_a_split_all_reduce_hands_it_over(cards):
    reports = _ranks(cards, "late_split", NPUSIM_HCCL_HOST_WAIT_MS="5")
    for r, rep in enumerate(reports):
        assert rep["bad"] == [], (r, rep["bad"])
    assert sum(rep["host"]["handed"] for rep in reports[1:]) >= 3, reports


@pytest.mark.ray
def test_a_collective_never_blocks_what_the_rank_enqueues_after_it(cards):
    """Rank 1 first needs rank 0's send, which rank 0 enqueues after its all_reduce (as on CANN, where
    enqueueing never blocks). With HCCL_EXEC_TIMEOUT=60 a deadlock would fail the test as an error."""
    reports = _ranks(cards, "hazard")
    for r, rep in enumerate(reports):
        assert rep["bad"] == [] and rep["errors"] == [], (r, rep)


@pytest.mark.ray
def test_synchronize_returns_only_after_copies_to_host_memory_landed(cards):
    """synchronize_stream's check without a round trip must also wait for device-to-host copies into
    ordinary numpy arrays, which the host fills when the card's notification arrives."""
    for r, rep in enumerate(_ranks(cards, "landing")):
        assert rep["bad"] == [], (r, rep["bad"])


@pytest.mark.ray
def test_mismatched_calls_fail_on_every_rank_and_the_comm_recovers(cards):
    reports = _ranks(cards, "mismatch")
    for r, rep in enumerate(reports):
        assert rep["bad"] == [], (r, rep["bad"])
        assert len(rep["errors"]) == 1, (r, rep)
        code, message = rep["errors"][0]
        assert code == E_PARA and "different collectives" in message and "count=64" in message, message


@pytest.mark.ray
def test_a_remembered_call_never_writes_through_its_view_of_a_freed_buffer(cards):
    """The host path keeps a call signature's views of its buffers; after a free the same call goes to the card,
    whose memory checker refuses the freed pointer — on every rank, at synchronize."""
    reports = _ranks(cards, "reuse")
    for r, rep in enumerate(reports):
        assert rep["bad"] == [], (r, rep["bad"])
        assert rep["host"]["done"] >= 1, rep
        assert len(rep["errors"]) == 1, (r, rep)


# ---------------------------------------------------------------------- the pieces, without Ray
def test_device_map_views_only_live_own_allocations(dev0):
    rt = dev0
    ctx = rt.get_context()
    a = np.arange(100, dtype=np.int32)
    ptr = rt.malloc(a.nbytes)
    rt.memcpy(ptr, a.nbytes, a, a.nbytes, rt.ACL_MEMCPY_HOST_TO_DEVICE)
    view = ctx.devmap.view(ptr + 8, 40)
    assert np.array_equal(view.view(np.int32), a[2:12])
    view.view(np.int32)[:] = -1                               # writes land in card memory
    back = np.empty_like(a)
    rt.memcpy(back, back.nbytes, ptr, a.nbytes, rt.ACL_MEMCPY_DEVICE_TO_HOST)
    assert np.array_equal(back[2:12], np.full(10, -1)) and np.array_equal(back[12:], a[12:])
    assert ctx.devmap.view(ptr, a.nbytes + 1) is None        # past the end
    assert ctx.devmap.view(ptr - 512, 16) is None             # before it
    rt.free(ptr)
    assert ctx.devmap.view(ptr, 4) is None                    # freed


def test_stream_progress_is_shared_without_a_round_trip(dev0):
    rt = dev0
    client = rt.get_context().client
    st = rt.create_stream()
    assert client.stream_done(st.id)
    rt.sleep_kernel(0.3, st)
    assert not client.stream_done(st.id)
    rt.synchronize_stream(st)
    assert client.stream_done(st.id)
    rt.launch_kernel("Relu", [rt.Tensor(rt.malloc(16), (4,), np.float32, owns=True)],
                     [rt.Tensor(rt.malloc(16), (8,), np.float32, owns=True)], stream=st)   # shape error
    with pytest.raises(rt.AclError):
        rt.synchronize_stream(st)          # an error pending is never skipped by the fast check
    assert client.stream_done(st.id)
    rt.destroy_stream(st)


def test_comm_init_all_has_no_host_path(rt_local):
    comms = hccl.comm_init_all([0, 1])
    try:
        assert all(c.host_path() is None for c in comms)
    finally:
        for c in comms:
            hccl.comm_destroy(c)


def test_free_waits_for_a_host_side_collective_using_the_context(dev0):
    rt = dev0
    ctx = rt.get_context()
    ptr = rt.malloc(64)
    freed = threading.Event()
    with ctx.devmap.hold():
        assert ctx.devmap.view(ptr, 64) is not None
        t = threading.Thread(target=lambda: (rt.set_context(ctx), rt.free(ptr), freed.set()))
        t.start()
        assert not freed.wait(0.3)              # the free waits while the view may be in use
    assert freed.wait(10)
    t.join(10)
    assert ctx.devmap.view(ptr, 64) is None


@pytest.mark.ray
def test_a_rank_later_than_its_peers_timeout_fails_too(cards):
    """Ranks 1-3 give up on an all_reduce after HCCL_EXEC_TIMEOUT (1 s); rank 0 arrives 4 s late. It must not
    complete the collective out of its peers' stale stages: it fails, told that they gave up."""
    reports = _ranks(cards, "gave_up", HCCL_EXEC_TIMEOUT="1")
    for r, rep in enumerate(reports):
        assert rep["bad"] == [], (r, rep["bad"])
        assert len(rep["errors"]) == 1, (r, rep)
    timeout = int(hccl.HcclResult.HCCL_E_TIMEOUT)
    assert all(code == timeout and "timed out after 1 s" in text for code, text in
               (rep["errors"][0] for rep in reports[1:])), reports
    code, text = reports[0]["errors"][0]
    assert code == timeout and "gave up on #2 after its 1 s HCCL_EXEC_TIMEOUT" in text, text
