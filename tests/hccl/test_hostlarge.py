"""Large collectives run by the rank's own process (hccl/hostsched.py), against numpy, on 8 real card actors.

Eight card actors are started once for the module (as ``launch`` does); each test runs eight rank processes
of ``tests/scripts/hostlarge_rank.py`` that see one card each. Every collective here is above the stages'
256 KiB, so without the host schedule it would run on the cards.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import uuid

import pytest

import hccl

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "hostlarge_rank.py"
N = 8
E_PARA = int(hccl.HcclResult.HCCL_E_PARA)
E_REMOTE = int(hccl.HcclResult.HCCL_E_REMOTE)


@pytest.fixture(scope="module")
def cards(ray_session):
    import ray

    from rt.config import load_config
    from rt.ray import session
    job = "hlarge" + uuid.uuid4().hex[:8]
    sockets = os.path.join(session.socket_root(), job)
    handles = session.create_cards(job, 0, ray.get_runtime_context().get_node_id(), load_config(None), count=N,
                                   socket_dir=sockets)
    yield sockets
    session.destroy_cards(handles)


def _ranks(sockets, scenario, per_rank=None, **env_extra):
    """Run the scenario on N rank processes (``per_rank(r)``: extra env of rank r); their JSON reports."""
    root = hccl.get_root_info().to_bytes().hex()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HCCL_", "NPUSIM_", "ASCEND_RT_", "RAY_ADDRESS"))}
    env.update(HCCL_EXEC_TIMEOUT="60", NPUSIM_CARD_DIR=sockets, NPUSIM_NODE="0",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), **env_extra)
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), scenario, str(r), str(N), root], text=True,
                              env=dict(env, ASCEND_RT_VISIBLE_DEVICES=str(r), **(per_rank(r) if per_rank else {})),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(N)]
    reports = []
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0, f"rank {r} exited {p.returncode}: {err[-3000:]}"
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
    return reports


@pytest.mark.slow
@pytest.mark.ray
def test_every_large_collective_run_by_the_ranks_equals_numpy(cards):
    reports = _ranks(cards, "all")
    for r, rep in enumerate(reports):
        assert rep["bad"] == [], (r, rep["bad"])
    # all_reduce, broadcast, all_gather, reduce_scatter, scatter, all_to_all have host schedules (2 dtypes)
    assert sum(rep["host"]["done"] for rep in reports) >= N * 4, reports
    assert len({rep["digest"] for rep in reports}) == 1         # every rank holds the same bits


@pytest.mark.slow
@pytest.mark.ray
def test_ranks_on_the_host_and_on_their_cards_interoperate(cards):
    reports = _ranks(cards, "mixed")
    for r, rep in enumerate(reports):
        assert rep["bad"] == [], (r, rep["bad"])
    assert all(rep["host"]["done"] <= 2 for rep in reports[1::2])     # busy streams: the card did it (but for
    assert sum(rep["host"]["done"] for rep in reports[0::2]) > 0     # random_sum, unheld)
    assert len({rep["digest"] for rep in reports}) == 1         # host and card: the same reduction order


@pytest.mark.slow
@pytest.mark.ray
def test_ranks_with_the_host_path_off_interoperate(cards):
    reports = _ranks(cards, "all", per_rank=lambda r: {"NPUSIM_HCCL_HOST_PATH": "0"} if r in (2, 5) else {})
    for r, rep in enumerate(reports):
        assert rep["bad"] == [], (r, rep["bad"])
    assert reports[2]["host"] is None and reports[5]["host"] is None
    assert len({rep["digest"] for rep in reports}) == 1


@pytest.mark.slow
@pytest.mark.ray
def test_a_hand_over_between_steps_continues_from_the_next_step(cards):
    """With no wait at the step barriers (``hostsched.MID_WAIT = 0`` in the ranks), ranks hand the rest of most
    collectives to their cards after a step (``hccl_resume`` with start > 0): the results stay exact."""
    reports = _ranks(cards, "midway")
    for r, rep in enumerate(reports):
        assert rep["bad"] == [], (r, rep["bad"])
    assert sum(rep["host"]["handed"] for rep in reports) >= 4 * N, reports
    assert len({rep["digest"] for rep in reports}) == 1


@pytest.mark.slow
@pytest.mark.ray
def test_late_peer_hands_the_rest_over_to_the_card(cards):
    reports = _ranks(cards, "late", NPUSIM_HCCL_HOST_WAIT_MS="5")
    for r, rep in enumerate(reports):
        assert rep["bad"] == [], (r, rep["bad"])
    assert sum(rep["host"]["handed"] for rep in reports[1:]) >= 3, reports


@pytest.mark.slow
@pytest.mark.ray
def test_a_dead_peer_is_reported_by_name(cards):
    reports = _ranks(cards, "dead")
    for r, rep in enumerate(reports[:-1]):
        assert rep["bad"] == [], (r, rep["bad"])
        assert len(rep["errors"]) == 1, (r, rep)
        code, message = rep["errors"][0]
        assert code == E_REMOTE and f"rank {N - 1}" in message and "EI0002" in message, message


@pytest.mark.slow
@pytest.mark.ray
def test_mismatched_large_calls_fail_on_every_rank_and_the_comm_recovers(cards):
    reports = _ranks(cards, "mismatch")
    for r, rep in enumerate(reports):
        assert rep["bad"] == [], (r, rep["bad"])
        assert len(rep["errors"]) == 1, (r, rep)
        code, message = rep["errors"][0]
        assert code == E_PARA and "different collectives" in message and "count=163846" in message, message


# ---------------------------------------------------------------------- the step code, without Ray
@pytest.mark.parametrize("algo", ["mesh", "ring", "hd"])
@pytest.mark.parametrize("n", [4, 8])
def test_chunked_steps_give_the_bits_of_the_reference_executor(algo, n, monkeypatch):
    """``algos.steps.run_step`` (card and host) in small chunks, rank after rank, equals ``run_numpy`` bit for bit,
    out of place and, for all_reduce and all_gather, in place; the pushing mesh broadcast and all_gather too."""
    import numpy as np

    from hccl import algos
    from hccl.algos import steps

    monkeypatch.setattr(steps, "CHUNK_BYTES", 64)
    monkeypatch.setattr(steps, "FAN_OUT_BYTES", 64)
    rng = np.random.default_rng(n)
    count = 1003
    for op, push in (("all_reduce", False), ("reduce_scatter", False), ("all_gather", False), ("broadcast", False),
                     ("reduce", False), ("scatter", False), ("all_to_all", False), ("all_gather", True),
                     ("broadcast", True)):
        if not algos.supports(algo, op) or (push and algo != "mesh"):
            continue
        kw = {"root": n - 1} if op in ("broadcast", "reduce", "scatter") else {}
        sched = algos.build(op, algo, n, count, **kw, **({"push": True} if push else {}))
        sizes = algos.buffer_sizes(op, n, count, tmp_count=sched.tmp_count, **kw)
        for in_place in ((False, True) if op in ("all_reduce", "all_gather") else (False,)):
            sends = [rng.standard_normal(s["send"]).astype(np.float32) if s["send"] else None for s in sizes]
            recvs = [sends[r] if in_place else np.zeros(s["recv"], np.float32) if s["recv"] else None
                     for r, s in enumerate(sizes)]
            if op == "broadcast":
                recvs = [rng.standard_normal(s["recv"]).astype(np.float32) for s in sizes]
            if op == "all_gather" and in_place:      # send is block r of recv
                recvs = [np.zeros(s["recv"], np.float32) for s in sizes]
                for r in range(n):
                    recvs[r][r * count:(r + 1) * count] = sends[r]
                sends = [recvs[r][r * count:(r + 1) * count] for r in range(n)]
            want = algos.run_numpy(sched, [None if a is None else a.copy() for a in sends],
                                   [None if a is None else a.copy() for a in recvs])
            empty = np.empty(0, np.float32)
            arrays = {r: {"send": empty if sends[r] is None else sends[r],
                          "recv": empty if recvs[r] is None else recvs[r],
                          "tmp": np.zeros(sched.tmp_count, np.float32)} for r in range(n)}
            for si in range(len(sched.steps)):
                for r in range(n):
                    steps.run_step(sched, si, r, arrays, 0)
            for r in range(n):
                if want[r] is not None:
                    assert np.array_equal(arrays[r]["recv"], want[r]), (op, algo, n, in_place, r)


def test_a_fan_out_to_destinations_just_ahead_of_the_source_goes_through_a_bounce_buffer(monkeypatch):
    """A destination less than ``ALIAS_BAND`` bytes ahead of the source within a page (glibc's non-temporal copy
    stalls on it) gets each chunk through a buffer at its own page offset; the others directly; same bits."""
    import numpy as np

    from hccl.algos import mesh, steps

    monkeypatch.setattr(steps, "FAN_OUT_BYTES", 4096)
    monkeypatch.setattr(steps, "_nt", 2048)
    bounced = []
    real = steps._bounce
    monkeypatch.setattr(steps, "_bounce", lambda chunk, page, nt: bounced.append(page) or real(chunk, page, nt))
    n, count = 4, 4 * 5000 + 3                       # float32: 20 KiB per rank's chunk, 4 KiB fan-out chunks

    def at(page_offset):                             # a float32 array starting ``page_offset`` bytes into a page
        raw = np.zeros(count * 4 + 2 * steps.PAGE, np.uint8)
        start = (page_offset - raw.ctypes.data) % steps.PAGE
        return raw[start: start + count * 4].view(np.float32)
    recvs = [at(off) for off in (0, 0x200, 0x800, 0x3c0)]     # ranks 1 and 3: just ahead of rank 0's buffer
    recvs[0][:] = np.random.default_rng(0).standard_normal(count).astype(np.float32)
    sched = mesh.broadcast(n, count, root=0, push=True)
    arrays = {r: {"send": np.empty(0, np.float32), "recv": recvs[r], "tmp": np.empty(0, np.float32)} for r in range(n)}
    steps.run_step(sched, 0, 0, arrays, 0)           # rank 0 pushes its chunk (the root's own) to ranks 1-3
    lo, hi = 0, -(-count // n)
    for r in (1, 2, 3):            # copies, no arithmetic: the same bits on every CPU
        assert np.array_equal(recvs[r][lo:hi], recvs[0][lo:hi]), r
    assert sorted(set(bounced)) == [0x200, 0x3c0] and len(bounced) == 2 * -(-(hi - lo) * 4 // 4096)
