"""The flight recorder, its cross-rank analyzer and the job timeline, on deliberately broken programs.

Each program in ``programs/`` breaks a 4-rank job in one way; it runs under ``launch``'s job loop on the
session's warm cards (HCCL_EXEC_TIMEOUT=3, so a hang becomes EI0002 within seconds) and the failure box's
diagnosis must name the rank, the call, the values and the call site.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).resolve().parent / "programs"


def line_of(program: str, marker: str) -> str:
    """``program.py:N`` of the line carrying ``# marker``."""
    for n, text in enumerate((PROGRAMS / program).read_text().splitlines(), start=1):
        if f"# {marker}" in text:
            return f"{program}:{n}"
    raise AssertionError(f"{marker} not in {program}")


@pytest.fixture
def run_program(npu_session, tmp_path):
    from launcher.launch.cli import report
    from launcher.launch.config import make_run_config
    from launcher.launch.job import run

    def go(name: str, nproc: int = 4, args=(), profile=None, **env_extra):
        env = {**os.environ, "HCCL_EXEC_TIMEOUT": "3", **env_extra}
        rc = make_run_config([str(PROGRAMS / f"{name}.py"), *args], nproc=nproc, log_dir=str(tmp_path / "logs"),
                             env=env, timeout=90, profile=profile)
        result = run(rc)
        boxes = []
        report(rc, result, boxes.append)
        return result, "\n".join(boxes)
    return go


def diagnosis_of(result) -> str:
    assert result.diagnosis, "no diagnosis"
    return "\n".join(result.diagnosis)


@pytest.mark.timeout(120)
def test_a_skipped_collective_names_the_rank_that_never_entered_and_its_last_call(run_program, tmp_path):
    result, box = run_program("skipped")
    assert result.status == "failed"
    text = diagnosis_of(result)
    assert "Diagnosis (flight recorder; python -m hccl.trace" in box and text.splitlines()[0] in box
    first = text.splitlines()[0]
    assert first.startswith("all_reduce #2 on comm") and line_of("skipped.py", "SKIPPED_LINE") in first
    # ranks 0, 2 and 3 entered it; each is "failed" once its own HCCL_EXEC_TIMEOUT expired, or "started" if the
    # job was stopped (the first failure ends it) a moment before its own timeout did
    entered = sorted(int(r) for group in re.findall(r"ranks? ([\d, ]+) (?:failed|started)", first)
                     for r in group.split(", "))
    assert entered == [0, 2, 3] and "failed" in first, first
    rank1 = next(line for line in text.splitlines() if "rank 1 never entered it" in line)
    assert "its last entry on this comm is all_reduce #1 (completed)" in rank1 and "skipped.py:8" in rank1
    assert "when dumped it was at skipped.py:14" in rank1
    assert "EI0002" in text
    # The same from the command line, reading the dumps --log-dir kept.
    out = subprocess.run([sys.executable, "-m", "hccl.trace", str(tmp_path / "logs")], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0 and first in out.stdout


@pytest.mark.timeout(120)
def test_a_mismatched_count_names_the_odd_rank_and_both_calls(run_program):
    result, _ = run_program("mismatch")
    text = diagnosis_of(result)
    line = next(x for x in text.splitlines() if x.startswith("all_reduce #1 on comm"))
    assert "rank 2 called all_reduce(count=512, dtype=FP32, op=SUM)" in line
    assert "where ranks 0, 1, 3 called all_reduce(count=1024, dtype=FP32, op=SUM)" in line
    assert line_of("mismatch.py", "MISMATCH_LINE") in line


@pytest.mark.timeout(120)
def test_a_different_collective_order_is_called_an_order_difference(run_program):
    result, _ = run_program("order")
    text = diagnosis_of(result)
    line = text.splitlines()[0]
    assert line.startswith("collective order differs on comm") and "at #1" in line
    assert "rank 1 called broadcast(count=1024, dtype=FP32, root=0)" in line
    assert "then all_reduce(count=1024, dtype=FP32, op=SUM)" in line
    assert "ranks 0, 2, 3 called all_reduce" in line and line_of("order.py", "BCAST_LINE") in line


@pytest.mark.timeout(120)
def test_a_rank_that_dies_is_named_and_its_peers_are_seen_waiting(run_program):
    # The peers must be inside all_reduce #2 when rank 3's death stops the job: rank 3 dies a second after
    # entering it would have, and the peers' host path waits (instead of handing over to their cards after
    # 20 ms), so a loaded machine cannot turn "in the call" into "not entered yet" or "started on the card".
    result, box = run_program("dies", NPUSIM_HCCL_HOST_WAIT_MS="20000")
    text = diagnosis_of(result)
    assert "rank 3 left no flight-recorder dump" in text
    line = next(x for x in text.splitlines() if x.startswith("all_reduce #2"))
    assert "ranks 0–2 in the call" in line
    assert "rank 3 is not in it" in text
    assert "SIGKILL" in box


@pytest.mark.timeout(120)
def test_a_rank_stuck_behind_a_long_kernel_is_named_with_the_kernel(run_program):
    result, _ = run_program("long_kernel")
    text = diagnosis_of(result)
    first = text.splitlines()[0]
    assert first.startswith("all_reduce #1 on comm") and "rank 2 enqueued" in first
    assert "its stream was still running kernel sleep(60 s)" in first
    stuck = next(x for x in text.splitlines() if x.startswith("rank 2 is stuck in synchronize_stream"))
    assert line_of("long_kernel.py", "SYNC_LINE") in stuck and "kernel sleep(60 s)" in stuck
    assert line_of("long_kernel.py", "ALLREDUCE_LINE") in stuck


# ---- the timeline --------------------------------------------------------------------------------------

PHASES = {"X", "M", "C", "s", "f", "i"}


def check_chrome_trace(trace: dict) -> None:
    """The subset of the Chrome trace-event format the file uses, checked field by field."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    flows: dict[int, list] = {}
    for e in trace["traceEvents"]:
        assert e["ph"] in PHASES, e
        assert isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index") and isinstance(e["args"], dict)
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["tid"], int) and e["dur"] > 0
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
        if e["ph"] in "sf":
            flows.setdefault(e["id"], []).append(e["ph"])
    assert all(sorted(v) == ["f", "s"] for v in flows.values()), "every flow starts once and ends once"


@pytest.mark.timeout(240)
def test_launch_profile_of_the_training_example_has_every_rank_card_and_collective_flow(run_program, tmp_path):
    out = tmp_path / "train.json"
    from launcher.launch.config import make_run_config
    from launcher.launch.job import run
    rc = make_run_config([str(ROOT / "examples" / "train.py"), "--epochs", "1", "--train-size", "2048",
                          "--quiet"], nproc=8, timeout=180, profile=str(out))
    result = run(rc)
    assert result.status == "succeeded"
    trace = json.loads(out.read_text())
    check_chrome_trace(trace)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert {f"rank {r} (host)" for r in range(8)} <= names
    assert {f"card {c} (node 0)" for c in range(8)} <= names
    events = trace["traceEvents"]
    collectives = [e for e in events if e["ph"] == "X" and e.get("cat") == "card" and "#" in e["name"]]
    assert collectives and all("[" in e["name"] for e in collectives)     # "all_reduce #3 [ring]"
    links = [e for e in events if e["ph"] == "s" and e["cat"] == "collective"]
    by_call = {}
    for e in links:
        by_call.setdefault((e["args"]["comm"], e["args"]["seq"]), []).append(e)
    assert by_call and all(len(v) == 7 for v in by_call.values())       # rank 0 → 1 → ... → 7
    assert any(e["ph"] == "s" and e["cat"] == "flow" for e in events)      # host call → card task
    assert any(e["ph"] == "C" and e["name"] == "memory in use" for e in events)


def test_a_scheduled_collective_shows_one_child_slice_per_algorithm_step():
    from launcher.launch import profile
    log = [["hccl_collective#1", 1, 1000, 9000, True, {"comm": "w", "seq": 1, "op": "broadcast", "algo": "mesh",
                                                         "steps": [4000, 9000]}, 4096]]
    dumps = [{"rank": str(r), "entries": [{"kind": "collective", "op": "broadcast", "comm": "w", "seq": 1,
                                           "card": f"card {r} (node 0)", "stream": 0, "task": 1, "t_enq": 500}],
              "cards": {f"card {r} (node 0)": [10_000, {"0": log}]}} for r in range(2)]
    trace = profile.build(dumps)
    check_chrome_trace(trace)
    steps = [e for e in trace["traceEvents"] if e.get("cat") == "step"]
    assert [(e["name"], e["ts"], e["dur"]) for e in steps] == [("step 0", 0.5, 3.0), ("step 1", 3.5, 5.0)] * 2
    assert [e["name"] for e in trace["traceEvents"] if e.get("cat") == "card"] == ["broadcast #1 [mesh]"] * 2
    assert sum(1 for e in trace["traceEvents"] if e["ph"] == "s") == 3      # 2 enqueues + rank 0 → rank 1


# ---- the recorder alone (no Ray) -------------------------------------------------------------------------

PROGRAM = """
import os, signal, sys, time
import numpy as np
import rt
rt.init(backend="local")
rt.set_device(0)
a = rt.malloc(64)
ev = rt.create_event()
for i in range(int(sys.argv[1])):
    rt.record_event(ev)
    rt.synchronize_event(ev)
rt.sleep_kernel(0.2)
rt.synchronize_stream(None)
if sys.argv[2] == "usr1":
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.5)
else:
    print(rt.trace_dump(sys.argv[2]))
"""


def _run(tmp_path, n, how, **env):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    return subprocess.run([sys.executable, str(prog), str(n), how], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def test_the_ring_is_bounded_and_a_dump_holds_card_task_times(tmp_path):
    path = tmp_path / "d.json"
    out = _run(tmp_path, 50, str(path), NPUSIM_TRACE_BUFFER_SIZE="30")
    assert out.returncode == 0, out.stderr
    d = json.loads(path.read_text())
    assert len(d["entries"]) == 30 and d["dropped"] > 0 and d["buffer_size"] == 30
    waits = [e for e in d["entries"] if e["op"] == "synchronize_stream"]
    assert waits and waits[-1]["t_end"] >= waits[-1]["t_enq"] and waits[-1]["site"].endswith("prog.py:13")
    records = [e for e in d["entries"] if e["op"] == "record_event"]
    assert records and all(e["state"] == "completed" and e["t_end"] >= e["t_start"] for e in records)
    (_, logs), = d["cards"].values()
    sleeps = [t for t in logs["0"] if (t[5] or {}).get("kernel") == "sleep(0.2 s)"]
    assert len(sleeps) == 1 and sleeps[0][3] - sleeps[0][2] >= 0.19e9


def test_size_zero_turns_the_recorder_off(tmp_path):
    path = tmp_path / "d.json"
    out = _run(tmp_path, 5, str(path), NPUSIM_TRACE_BUFFER_SIZE="0")
    assert out.returncode == 0, out.stderr
    assert json.loads(path.read_text())["entries"] == []


def test_sigusr1_dumps_into_the_dump_directory_and_the_program_goes_on(tmp_path):
    out = _run(tmp_path, 3, "usr1", NPUSIM_TRACE_DUMP_DIR=str(tmp_path / "dumps"))
    assert out.returncode == 0, out.stderr
    dumps = list((tmp_path / "dumps").glob("trace_rank*.json"))
    assert len(dumps) == 1
    d = json.loads(dumps[0].read_text())
    assert d["reasons"] == ["SIGUSR1 received"] and len(d["entries"]) >= 7


def test_the_analyzer_says_so_when_everything_completed(tmp_path):
    from hccl import trace
    dump = {"rank": "0", "pid": 1, "now_ns": 10, "entries": [
        {"kind": "collective", "op": "all_reduce", "comm": "w", "seq": 1, "size": 2, "count": 4, "dtype": 4,
         "reduce": 0, "state": "completed", "site": "t.py:1", "t_enq": 1, "fingerprint": "a"}], "cards": {}}
    for r in (0, 1):
        (tmp_path / f"trace_rank{r}.json").write_text(json.dumps(dict(dump, rank=str(r))))
    assert trace.diagnose(str(tmp_path)) == ["2 dumps read; every recorded collective completed on every rank"]
    (tmp_path / "trace_rank1.json").unlink()
    assert trace.diagnose(str(tmp_path))[0].startswith("rank 1 left no flight-recorder dump")
    assert trace.diagnose(str(tmp_path / "none")) == [f"no flight-recorder dumps in {tmp_path / 'none'}"]


def test_the_analyzer_says_how_ranks_without_a_dump_ended_and_names_a_multi_line_exception(tmp_path):
    """With launch's record of how ranks ended, a rank without a dump is said to have exited normally (code 0),
    been stopped by launch, or died; an exception whose message spans lines is named by its first line."""
    from hccl import trace
    exc = ('Traceback (most recent call last):\n  File "/home/u/train.py", line 7, in <module>\n    run()\n'
           'NotImplementedError: Could not run \'aten::foo\' with arguments from the \'CPU\' backend.\n'
           '\nCPU: registered at /build/aten.cpp:31\nPythonDispatcher: registered at /build/py.cpp:194\n')
    dump = {"rank": "0", "pid": 1, "now_ns": 10, "exception": exc, "cards": {}, "entries": [
        {"kind": "collective", "op": "all_reduce", "comm": "w", "seq": 1, "size": 4, "count": 4, "dtype": 4,
         "reduce": 0, "state": "completed", "site": "t.py:1", "t_enq": 1, "fingerprint": "a"}]}
    (tmp_path / "trace_rank0.json").write_text(json.dumps(dump))
    lines = trace.diagnose(str(tmp_path), 4, {1: 0, 2: "stopped", 3: -9})
    text = "\n".join(lines)
    assert "rank 1 exited normally (code 0)" in text
    assert "rank 2: stopped by launch" in text
    assert "rank 3 left no flight-recorder dump (the process died" in text
    assert "rank 0 raised NotImplementedError: Could not run 'aten::foo'" in text and "at train.py:7" in text
    assert "PythonDispatcher" not in text
