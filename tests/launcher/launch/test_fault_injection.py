"""Fault injection across processes (``launch --inject`` / ``spawn(inject=)`` / ``NPUSIM_FAULTS``) on warm cards:
each process-level fault — kill, kill_card, hang — against the same failure made by hand, ``restart=`` under
``--max-restarts``, the usage errors, and examples/train.py recovering from a killed rank.

The kill_card test kills a card actor of the session's warm pool (which then boots fresh cards): it runs last.
"""

import json
import os
import re
import signal
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import launcher
import rt
from launcher.launch.cli import main

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(120)
FAST = {"HCCL_EXEC_TIMEOUT": "2"}


def victim(mode, k, out):
    """Three all_reduces; rank 1 misbehaves as it enters its k-th — by itself (``mode`` kill, hang, kill_card) or
    not at all (mode "": the injected fault does it). Each rank writes the first error it sees to
    ``out/rank<R>.json`` and raises it again."""
    import hccl
    from rt.host.runtime import RUNTIME
    comm = hccl.init()
    if comm.rank == 0:                      # launch stops the job when rank 1 dies: let rank 0 report first
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    t = rt.Tensor.from_numpy(np.ones(16, np.float32))
    for i in range(1, 4):
        try:
            if comm.rank == 1 and i == k:
                if mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif mode == "hang":
                    while True:
                        time.sleep(3600)
                elif mode == "kill_card":
                    client = RUNTIME.current.client
                    os.kill(client.info["pid"], signal.SIGKILL)
                    while not client.lost:
                        time.sleep(0.005)
            comm.all_reduce(t)
            rt.synchronize_stream(None)
        except rt.NpuError as e:
            with open(os.path.join(out, f"rank{comm.rank}.json"), "w") as f:
                json.dump({"type": type(e).__name__, "code": e.code, "message": e.message}, f)
            raise
    return i


def _run(npu_spawn, tmp_path, name, mode, k=2, inject=None):
    """Run ``victim`` on 2 ranks (expected to fail); the LaunchError text and each rank's recorded error."""
    out = tmp_path / name
    out.mkdir()
    with pytest.raises(launcher.LaunchError) as info:
        npu_spawn(victim, nproc=2, args=(mode, k, str(out)), env=FAST, inject=inject, timeout=60)
    errors = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    return str(info.value), errors


def _shape(message: str) -> str:
    """A message without what differs from job to job (communicator ids, pids, the stream task numbers — how many
    earlier collectives the host path finished without the card depends on timing) and without the note about an
    injected fault that peers' errors carry."""
    message = re.sub(r" \((rank \d+|card \d+ \(node \d+\)) is under an injected fault, NPUSIM_FAULTS: [^ ]+\)$", "",
                     message)
    message = re.sub(r"task (\w+)#\d+ on stream \d+", r"task \1#<n> on stream <s>", message)   # how many tasks
    return re.sub(r"pid \d+", "pid <pid>", re.sub(r"comm '[^']*'", "comm '<id>'", message))   # went to the card


@pytest.mark.slow
def test_kill_is_a_rank_process_dying_of_sigkill(npu_spawn, tmp_path):
    text0, genuine = _run(npu_spawn, tmp_path, "genuine", "kill")
    text1, injected = _run(npu_spawn, tmp_path, "injected", "", inject="kill:rank=1:collective=2")
    assert sorted(genuine) == sorted(injected) == [0]                 # rank 1 died without a word
    g, i = genuine[0], injected[0]
    assert (i["type"], i["code"]) == (g["type"], g["code"]) == ("HcclError", 21)
    assert "EI0002 rank 1 (card 1) is gone: its process exited" in g["message"]
    assert _shape(i["message"]) == _shape(g["message"])
    assert i["message"].endswith("(rank 1 is under an injected fault, NPUSIM_FAULTS: kill:rank=1:collective=2)")
    for text in (text0, text1):
        assert re.search(r"rank 1 \(node 0\).*SIGKILL", text), text
    assert "npusim: rank 1 (pid " in text1 and "killed with SIGKILL as it enters all_reduce #2 on comm" in text1
    assert "(its collective #2) (injected by NPUSIM_FAULTS: kill:rank=1:collective=2)" in text1


def test_hang_is_a_rank_that_never_arrives_the_peers_time_out(npu_spawn, tmp_path, capsys):
    start = time.monotonic()
    _, genuine = _run(npu_spawn, tmp_path, "genuine", "hang")
    capsys.readouterr()
    _, injected = _run(npu_spawn, tmp_path, "injected", "", inject="hang:rank=1:collective=2")
    text = capsys.readouterr().err            # rank 1 did not fail: launch stopped it (its output says why)
    assert time.monotonic() - start < 40
    g, i = genuine[0], injected[0]
    assert (i["type"], i["code"]) == (g["type"], g["code"]) == ("HcclError", 9)
    assert "EI0002 timed out after 2 s (HCCL_EXEC_TIMEOUT) waiting for ranks [1]; arrived: [0]" in g["message"]
    assert _shape(i["message"]) == _shape(g["message"])
    assert i["message"].endswith("(rank 1 is under an injected fault, NPUSIM_FAULTS: hang:rank=1:collective=2)")
    assert "[rank1]:npusim: rank 1 (pid " in text and "hangs forever as it enters all_reduce #2" in text


def test_delay_past_the_timeout_is_a_timeout_and_p2p_kill_counts_sends(npu_spawn, tmp_path):
    _, errors = _run(npu_spawn, tmp_path, "delay", "", inject="delay:rank=1:collective=2:ms=60000")
    assert errors[0]["code"] == 9 and "waiting for ranks [1]" in errors[0]["message"]
    assert "(rank 1 is under an injected fault, NPUSIM_FAULTS: delay:rank=1:collective=2:ms=60000)" in \
        errors[0]["message"]
    results = npu_spawn(sender, nproc=2, args=(3,), inject="kill:rank=0:p2p=2", env=FAST, max_restarts=1)
    assert results == [["1", 3], ["1", 3]]            # restart 0 lost rank 0 at its 2nd send; restart 1 ran clean


def sender(n):
    """Rank 0 sends n times, rank 1 receives; both then join one all_reduce. Returns (RESTART_COUNT, sends)."""
    import hccl
    comm = hccl.init()
    t = rt.Tensor.from_numpy(np.ones(4, np.float32))
    for _ in range(n):
        (hccl.send if comm.rank == 0 else hccl.recv)(t.ptr, 4, hccl.HCCL_DATA_TYPE_FP32, 1 - comm.rank, comm)
    comm.all_reduce(t)
    rt.synchronize_stream(None)
    return [os.environ["RESTART_COUNT"], n]


def restart_count():
    import hccl
    comm = hccl.init()
    t = rt.Tensor.from_numpy(np.ones(4, np.float32))
    for _ in range(3):
        comm.all_reduce(t)
    rt.synchronize_stream(None)
    return os.environ["RESTART_COUNT"], float(t.numpy()[0])


def test_restart_n_picks_the_run_a_fault_happens_in(npu_spawn):
    assert npu_spawn(restart_count, nproc=2, max_restarts=1, inject="kill:rank=1:collective=3") == [("1", 8.0)] * 2
    assert npu_spawn(restart_count, nproc=2, max_restarts=1, inject="kill:rank=1:collective=3:restart=1") == \
        [("0", 8.0)] * 2
    with pytest.raises(launcher.LaunchError, match="after 1 restarts"):
        npu_spawn(restart_count, nproc=2, max_restarts=1,
                  inject="kill:rank=1:collective=3;kill:rank=0:collective=1:restart=1")


# ------------------------------------------------------------------------------------------------ usage errors
def _script(tmp_path, text):
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.mark.parametrize("spec, why", [
    ("explode:rank=1:collective=1", "--inject: bad fault 'explode:rank=1:collective=1': unknown action 'explode'"),
    ("kill:rank=1:collective=x", "--inject: bad fault 'kill:rank=1:collective=x': collective='x' is not a number"),
    ("kill:rank=2:collective=1", "--inject: fault 'kill:rank=2:collective=1': rank 2 is not a rank of this job "
                                 "(ranks 0..1)"),
    ("oom:card=5:malloc=1", "--inject: fault 'oom:card=5:malloc=1': card 5 of node 0 runs no rank of this job"),
])
def test_launch_refuses_a_bad_spec_as_a_usage_error(tmp_path, capsys, spec, why):
    path = _script(tmp_path, "print('ran')\n")
    assert main(["--no-cards", "--nproc", "2", "--inject", spec, path]) == 2
    out, err = capsys.readouterr()
    assert f"launch: error: {why}" in err and "ran" not in out, err


def test_a_bad_npusim_faults_in_the_environment_is_refused_too(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NPUSIM_FAULTS", "hang:rank=0")
    assert main(["--no-cards", "--nproc", "2", _script(tmp_path, "print('ran')\n")]) == 2
    assert "launch: error: NPUSIM_FAULTS: bad fault 'hang:rank=0': missing key 'collective' or 'p2p'" in \
        capsys.readouterr().err


def test_inject_gives_every_rank_npusim_faults(tmp_path, capsys):
    path = _script(tmp_path, "import os; print('F=' + os.environ['NPUSIM_FAULTS'])\n")
    assert main(["--no-cards", "--nproc", "2", "--inject", "delay:rank=0:collective=1:ms=5", path]) == 0
    out = capsys.readouterr().out
    assert out.count("F=delay:rank=0:collective=1:ms=5") == 2
    with pytest.raises(rt.NpuError, match="--inject: bad fault 'hang'"):
        launcher.spawn(restart_count, nproc=2, inject="hang", _no_cards=True)


# ------------------------------------------------------------------------------------------------ recovery
TRAIN = ["--epochs", "3", "--train-size", "2048", "--test-size", "256", "--batch-size", "256"]


def _final(out: str) -> str:
    lines = [line for line in out.splitlines() if "epoch 3/3:" in line]
    assert len(lines) == 1, out[-3000:]
    return lines[0]


@pytest.mark.timeout(240)
def test_train_with_a_killed_rank_and_one_restart_ends_as_an_undisturbed_run(npu_session, tmp_path, capsys):
    """6 parameter broadcasts, then 8 bucket all-reduces + 2 metric all-reduces per epoch: collective #31 is in
    epoch 3. Rank 1 can only get there after both ranks passed epoch 2's metric all-reduces, which rank 0 enters
    after writing the epoch-1 checkpoint (rank 1 may run ahead of rank 0's epoch-2 checkpoint: epoch 1 or 2)."""
    train = str(ROOT / "examples" / "train.py")
    assert main(["--nproc", "2", train, *TRAIN, "--checkpoint", str(tmp_path / "a.npz")]) == 0
    undisturbed = capsys.readouterr().out
    assert main(["--nproc", "2", "--max-restarts", "1", "--inject", "kill:rank=1:collective=31", train, *TRAIN,
                 "--checkpoint", str(tmp_path / "b.npz"), "--resume"]) == 0
    out, err = capsys.readouterr()
    assert "npusim: rank 1 (pid" in err and "killed with SIGKILL as it enters all_reduce #31" in err, err[-3000:]
    assert "(injected by NPUSIM_FAULTS: kill:rank=1:collective=31)" in err
    assert "restarting all 2 ranks (restart 1 of 1)" in out + err
    assert re.search(r"resumed from \S+b\.npz at epoch [12]", out), out[-3000:]
    final = _final(out)
    assert final == _final(undisturbed)                       # loss and accuracy: the same digits
    assert "test accuracy" in final


# ------------------------------------------------------------------------------------------------ kill_card (last)
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_kill_card_is_a_card_actor_dying(npu_spawn, tmp_path, capsys):
    _, genuine = _run(npu_spawn, tmp_path, "genuine", "kill_card")
    capsys.readouterr()
    _, injected = _run(npu_spawn, tmp_path, "injected", "", inject="kill_card:card=1:collective=2")
    text = capsys.readouterr().err
    assert sorted(genuine) == sorted(injected) == [0, 1]
    for rank, code, kind in ((0, 21, "HcclError"), (1, 507901, "AclError")):
        g, i = genuine[rank], injected[rank]
        assert (i["type"], i["code"]) == (g["type"], g["code"]) == (kind, code), (g, i)
        assert _shape(i["message"]) == _shape(g["message"]), (g, i)
    assert re.search(r"EI0002 rank 1 \(card 1, pid \d+\) died: its card process is gone", genuine[0]["message"])
    assert injected[0]["message"].endswith(
        "(card 1 (node 0) is under an injected fault, NPUSIM_FAULTS: kill_card:card=1:collective=2)")
    assert genuine[1]["message"] == "card 1 (node 0) is gone (its channel closed)"
    assert "[rank1]:npusim: card 1 (node 0) process (pid " in text and "killed with SIGKILL as rank 1 enters all_reduce #2" \
        in text and "(injected by NPUSIM_FAULTS: kill_card:card=1:collective=2)" in text


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
