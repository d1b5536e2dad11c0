"""The stream race detector on deliberately racy programs: each race is reported with both accesses (task,
stream, card, call site) and the bytes; the same program with the missing synchronisation reports nothing.

Runs in this process on in-process cards (the local backend); the detector is switched on per test."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import hccl
import rt
from rt.diag.racecheck import RACE, Detector
from rt.host.seam import SEAM

ROOT = Path(__file__).resolve().parents[2]
HERE = os.path.basename(__file__)


@pytest.fixture
def race(rt_local, monkeypatch):
    """The runtime with the detector on (report mode); yields a function returning the races reported."""
    monkeypatch.setenv("NPUSIM_RACE_CHECK", "1")
    fresh = Detector()
    fresh.configure()
    monkeypatch.setattr(RACE, "__dict__", fresh.__dict__)
    SEAM.refresh()                        # the detector's watching changed behind the seam's back
    rt_local.set_device(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", rt.RaceWarning)
        yield lambda: [str(w.message) for w in caught if issubclass(w.category, rt.RaceWarning)]
    monkeypatch.setattr(RACE, "__dict__", Detector().__dict__)
    SEAM.refresh()


def lineno(marker: str) -> str:
    for n, text in enumerate(Path(__file__).read_text().splitlines(), start=1):
        if text.rstrip().endswith(f"# {marker}"):
            return f"{HERE}:{n}"
    raise AssertionError(marker)


def tensor(n=1024):
    return rt.Tensor.from_numpy(np.ones(n, np.float32))


def copy_then_compute(wait: bool):
    x, y = tensor(), rt.empty((1024,), np.float32)
    copy_stream, compute = rt.create_stream(), rt.create_stream()
    data = np.full(1024, -2.0, np.float32)
    rt.memcpy_async(x.ptr, x.nbytes, data, data.nbytes, rt.ACL_MEMCPY_HOST_TO_DEVICE, copy_stream)  # COPY
    if wait:
        ev = rt.create_event()
        rt.record_event(ev, copy_stream)
        rt.stream_wait_event(compute, ev)
    rt.launch_kernel("Relu", [x], [y], stream=compute)                                             # RELU
    rt.synchronize_device()
    return y.numpy()


def test_a_missing_event_wait_between_a_copy_stream_and_a_compute_stream(race):
    copy_then_compute(wait=False)
    (msg,) = race()
    assert "memcpy_async (host to device)" in msg and lineno("COPY") in msg
    assert "kernel Relu" in msg and lineno("RELU") in msg
    assert "writes them" in msg and "reads them" in msg and "bytes [0, 4096)" in msg
    assert "stream " in msg and "card 0 (node 0)" in msg and "allocation of 4096 bytes" in msg


def test_the_same_with_the_event_wait_reports_nothing(race):
    np.testing.assert_array_equal(copy_then_compute(wait=True), np.zeros(1024, np.float32))
    assert race() == []


def read_result(sync: bool):
    x, y = tensor(), rt.empty((1024,), np.float32)
    s = rt.create_stream()
    rt.launch_kernel("Relu", [x], [y], stream=s)                                         # PRODUCE
    if sync:
        rt.synchronize_stream(s)
    out = np.empty(1024, np.float32)
    rt.memcpy(out, out.nbytes, y.ptr, y.nbytes, rt.ACL_MEMCPY_DEVICE_TO_HOST)            # READ
    rt.synchronize_stream(s)
    return out


def test_a_host_read_before_synchronize(race):
    read_result(sync=False)
    (msg,) = race()
    assert "kernel Relu" in msg and lineno("PRODUCE") in msg
    assert "memcpy (device to host)" in msg and "on the host" in msg and lineno("READ") in msg


def test_a_host_read_after_synchronize_reports_nothing(race):
    np.testing.assert_array_equal(read_result(sync=True), np.ones(1024, np.float32))
    assert race() == []


def collective_on_a_second_stream(wait: bool):
    comms = hccl.comm_init_all([0, 1])
    bufs, comm_streams = [], []
    for dev, comm in zip((0, 1), comms):
        rt.set_device(dev)
        compute, comm_stream = rt.create_stream(), rt.create_stream()
        x, g = tensor(256), rt.empty((256,), np.float32)
        rt.launch_kernel("Relu", [x], [g], stream=compute)                                   # GRAD
        if wait:
            ev = rt.create_event()
            rt.record_event(ev, compute)
            rt.stream_wait_event(comm_stream, ev)
        bufs.append(g)
        comm_streams.append((comm, comm_stream))
    for g, (comm, stream) in zip(bufs, comm_streams):
        rt.set_device(comm.device)
        hccl.all_reduce(g.ptr, g.ptr, 256, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm, stream)  # ALLREDUCE
    for dev in (0, 1):
        rt.set_device(dev)
        rt.synchronize_device()
    out = [g.numpy() for g in bufs]
    for c in comms:
        hccl.comm_destroy(c)
    return out


def test_a_collective_on_a_second_stream_without_an_event(race):
    collective_on_a_second_stream(wait=False)
    found = race()
    assert len(found) == 2                         # one per rank (card)
    for msg in found:
        assert "kernel Relu" in msg and lineno("GRAD") in msg
        assert "all_reduce #1" in msg and lineno("ALLREDUCE") in msg
    assert {m.split("device memory")[1].split()[0] for m in found}.__len__() == 2


def test_the_collective_after_an_event_wait_reports_nothing(race):
    out = collective_on_a_second_stream(wait=True)
    assert race() == []
    for o in out:
        np.testing.assert_array_equal(o, np.full(256, 2.0, np.float32))


def free_with_a_queued_reader(sync: bool):
    x, y = tensor(), rt.empty((1024,), np.float32)
    s = rt.create_stream()
    rt.sleep_kernel(0.05, stream=s)
    rt.launch_kernel("Relu", [x], [y], stream=s)                                         # READER
    if sync:
        rt.synchronize_stream(s)
    x.free()                                                                             # FREE
    rt.synchronize_stream(s)


def test_a_free_with_a_queued_reader(race):
    free_with_a_queued_reader(sync=False)
    (msg,) = race()
    assert msg.startswith("race: rt.free at") and lineno("FREE") in msg
    assert "kernel Relu" in msg and lineno("READER") in msg and "reads bytes [0, 4096)" in msg


def test_a_free_after_synchronize_reports_nothing(race):
    free_with_a_queued_reader(sync=True)
    assert race() == []


def peer_copy(wait: bool):
    rt.set_device(1)
    b = rt.empty((1024,), np.float32)
    out = rt.empty((1024,), np.float32)
    consumer = rt.create_stream()
    rt.set_device(0)
    a = tensor()
    producer = rt.create_stream()
    rt.memcpy_async(b.ptr, b.nbytes, a.ptr, a.nbytes, rt.ACL_MEMCPY_DEVICE_TO_DEVICE, producer)     # PEER
    if wait:
        ev = rt.create_event()
        rt.record_event(ev, producer)
        rt.stream_wait_event(consumer, ev)
    rt.set_device(1)
    rt.launch_kernel("Relu", [b], [out], stream=consumer)                                          # CONSUME
    rt.synchronize_stream(consumer)
    rt.set_device(0)
    rt.synchronize_stream(producer)
    rt.set_device(1)
    return out.numpy()


def test_a_race_between_two_cards_through_a_peer_copy(race):
    peer_copy(wait=False)
    (msg,) = race()
    assert "memcpy_async (device to device)" in msg and "card 0 (node 0)" in msg and lineno("PEER") in msg
    assert "kernel Relu" in msg and "card 1 (node 0)" in msg and lineno("CONSUME") in msg


def test_the_peer_copy_with_an_event_across_cards_reports_nothing(race):
    np.testing.assert_array_equal(peer_copy(wait=True), np.ones(1024, np.float32))
    assert race() == []


def test_raise_mode_raises_at_the_next_synchronize(race, monkeypatch):
    monkeypatch.setattr(RACE, "mode", "raise")
    with pytest.raises(rt.RaceError) as info:
        copy_then_compute(wait=False)
    assert info.value.code == 500001 and "synchronize_device: the race detector" in info.value.message
    assert lineno("COPY") in info.value.message and len(info.value.races) == 1
    assert race() == []


def test_a_bad_setting_is_refused():
    out = subprocess.run([sys.executable, "-c", "import rt; rt.init(backend='local'); rt.set_device(0); rt.malloc(8)"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={**os.environ, "NPUSIM_RACE_CHECK": "yes please"})
    assert out.returncode == 1 and "NPUSIM_RACE_CHECK='yes please'" in out.stderr and "100000" in out.stderr


@pytest.mark.parametrize("example", ["scenarios.py", "mdl_infer.py", "infer_sharded.py"])
def test_no_false_positives_on_the_examples(example):
    # In-process cards: the detector runs on the host and orders by vector clocks, not by timing, so what it
    # sees does not depend on where the cards run (and no Ray session has to start for each example).
    out = subprocess.run([sys.executable, str(ROOT / "examples" / example)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env={**os.environ, "NPUSIM_RACE_CHECK": "raise",
                                                     "NPUSIM_BACKEND": "local"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RaceError" not in out.stderr


@pytest.mark.timeout(180)
def test_no_false_positives_on_eight_rank_training(npu_session, tmp_path):
    """examples/train.py on 8 ranks (DDP buckets all-reduced on a comm stream behind events) with the detector
    raising: any race would fail a rank at its next synchronize."""
    from launcher.launch.config import make_run_config
    from launcher.launch.job import run
    rc = make_run_config([str(ROOT / "examples" / "train.py"), "--epochs", "1", "--train-size", "2048", "--quiet"],
                         nproc=8, timeout=150, log_dir=str(tmp_path / "logs"),
                         env={**os.environ, "NPUSIM_RACE_CHECK": "raise"})
    result = run(rc)
    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("rank*.log")))
    assert result.status == "succeeded", logs[-3000:]
    assert "RaceError" not in logs and "RaceWarning" not in logs


RACY_RANK = """
import numpy as np, hccl, rt
comm = hccl.init()
g = rt.Tensor.from_numpy(np.ones(256, np.float32))
out = rt.empty((256,), np.float32)
compute, comm_stream = rt.create_stream(), rt.create_stream()
rt.launch_kernel("Relu", [g], [out], stream=compute)
hccl.all_reduce(out.ptr, out.ptr, 256, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm, comm_stream)
rt.synchronize_stream(comm_stream)
"""


@pytest.mark.timeout(120)
def test_launch_race_check_raise_fails_a_racy_rank_at_its_synchronize(npu_session, tmp_path):
    """The same path as above is not vacuous: a rank whose all_reduce skips the event fails with RaceError."""
    from launcher.launch.config import make_run_config
    from launcher.launch.job import run
    prog = tmp_path / "racy.py"
    prog.write_text(RACY_RANK)
    rc = make_run_config([str(prog)], nproc=2, timeout=90, log_dir=str(tmp_path / "logs"),
                         env={**os.environ, "NPUSIM_RACE_CHECK": "raise"})
    result = run(rc)
    assert result.status == "failed"
    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("rank*.log")))
    assert "rt.diag.racecheck.RaceError: [500001]" in logs or "RaceError" in logs
    assert "synchronize_stream: the race detector (NPUSIM_RACE_CHECK=raise) found 1 race(s)" in logs
    assert "kernel Relu" in logs and "racy.py:7" in logs and "all_reduce #1" in logs and "racy.py:8" in logs
