"""torch.distributed on simulated cards: the "hccl" c10d backend and the torch_npu shim, run as users run them
(`launch --nproc N script.py`, `torchrun`, `python script.py`), with torch's gloo backend as the oracle.
Skipped when torch is not installed (the core suite runs without it; CI installs the `torch` extra)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
pytestmark = pytest.mark.timeout(170)


def env(**extra):
    e = {k: v for k, v in os.environ.items()
         if k not in ("NPUSIM_BACKEND", "ASCEND_RT_VISIBLE_DEVICES", "RAY_ADDRESS", "MASTER_PORT", "MASTER_ADDR",
                      "WORLD_SIZE", "RANK", "LOCAL_RANK", "NPUSIM_CARD_DIR")}
    e.update(extra)
    return e


def launch(nproc, script, *args, timeout=150, **extra):
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "launcher", "--nproc", str(nproc), str(script), *map(str, args)],
                          check=False, capture_output=True, text=True, env=env(**extra), timeout=timeout, cwd=ROOT)
    return done, time.monotonic() - t0


def test_every_collective_matches_gloo():
    done, _ = launch(3, SCRIPTS / "vs_gloo.py")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for rank in range(3):
        assert f"[rank{rank}]:ALL OK" in done.stdout, done.stdout[-3000:]


def test_ddp_example_matches_single_process_training():
    done, _ = launch(4, ROOT / "examples" / "torch_ddp.py")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "[rank0]:ok: DDP over hccl on 4 simulated cards matches single-process training" in done.stdout


def test_a_torch_npu_training_script_matches_itself_on_cpu_and_gloo(tmp_path):
    """model.npu(), DDP over "hccl", amp autocast + GradScaler, a copy stream, timing events, memory_allocated —
    under launch and torchrun — against the same script on CPU tensors over gloo."""
    script = SCRIPTS / "user_train.py"
    runs = {}
    for how, device in (("launch", "npu"), ("torchrun", "npu"), ("launch", "cpu")):
        out = tmp_path / f"{how}-{device}.pt"
        if how == "launch":
            done, _ = launch(2, script, "--device", device, "--out", out)
        else:
            done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script),
                                   "--out", str(out)], capture_output=True, text=True, env=env(), timeout=150,
                                  cwd=ROOT, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert f"TRAINED on {device}" in done.stdout, done.stdout[-3000:]
        runs[how, device] = torch.load(out)
    oracle = runs["launch", "cpu"]
    assert oracle["losses"][-1] < oracle["losses"][0]
    for key in (("launch", "npu"), ("torchrun", "npu")):
        got = runs[key]
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(oracle["losses"]), rtol=2e-3, atol=2e-3)
        assert got["scale"] == oracle["scale"]
        for name, w in oracle["weights"].items():
            torch.testing.assert_close(got["weights"][name], w, rtol=1e-2, atol=5e-3, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("leaver", [1, 0])
def test_a_rank_that_leaves_is_named_at_once_with_ei0002(leaver):
    """Ascend's own fault-mode script: on real NPUs a 30-minute timeout, here the survivor fails at once."""
    from launcher.launch.config import free_port
    # the bound (no 30-minute hang: done within 60 s) is the deadline; it typically takes ~6 s
    done, _ = launch(2, SCRIPTS / "rank_leaves.py", leaver, timeout=60, FAULT_TEST_PORT=str(free_port()))
    survivor = 1 - leaver
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"[rank{survivor}]:[rank{survivor}]: torch.distributed.DistBackendError" in done.stderr
    assert f"EI0002 rank {leaver} (card {leaver}) is gone: its process exited" in done.stderr


@pytest.mark.parametrize("kind, words", [
    ("size", "rank 0 called all_reduce(count=4, dtype=FP32, op=SUM); rank 1 called all_reduce(count=5, dtype=FP32"),
    ("dtype", "rank 0 called all_reduce(count=4, dtype=FP32, op=SUM); rank 1 called all_reduce(count=4, dtype=FP16"),
    ("op", "rank 1 called all_reduce(count=4, dtype=FP32, op=MAX)")])
def test_mismatched_collectives_name_every_rank(kind, words):
    done, _ = launch(2, SCRIPTS / "mismatch.py", kind, timeout=90)
    assert done.returncode == 1
    # Both ranks detect the mismatch; but once one has failed, launch stops the other (SIGTERM), which may come
    # before that rank printed its own error. Every error that was printed names what each rank called.
    errors = [line for line in done.stderr.splitlines()
              for rank in (0, 1)
              if line.startswith(f"[rank{rank}]:[rank{rank}]: torch.distributed.DistBackendError: [Rank {rank}] hccl "
                                 f"all_reduce")]
    assert errors, done.stderr[-3000:]
    assert all(words in line for line in errors), errors
    # launch's diagnosis names the user's line of each call (the group runs it on a thread of its own)
    assert "at mismatch.py:18" in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]


def test_the_groups_timeout_is_hccls_execution_timeout():
    done, _ = launch(2, SCRIPTS / "slow_peer.py", 3, timeout=90)
    assert done.returncode == 1
    assert "EI0002 timed out after 3 s" in done.stderr and "waiting for ranks [1]" in done.stderr, done.stderr[-3000:]
    returned = [line for line in done.stdout.splitlines() if line.startswith("[rank0]:rank 0: all_reduce returned")]
    assert returned, done.stdout


def _ours(mark):
    """Processes alive now whose environment carries ``mark`` (what this test started, and their children)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.environ().get("NPUSIM_TEST_MARK") == mark:
                found.append(p)
        except (psutil.Error, OSError):
            continue                              # gone meanwhile, or not ours to read
    return found


def test_a_torchrun_job_shares_rank_zeros_cards_and_leaves_nothing():
    mark = f"torchrun-{os.getpid()}-{time.monotonic_ns()}"  # other jobs on this machine may start Ray meanwhile
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           str(SCRIPTS / "torchrun_job.py")], check=False, capture_output=True, text=True,
                          env=env(NPUSIM_TEST_MARK=mark), timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rank 0 of 2: ok on card 0" in done.stdout and "rank 1 of 2: ok on card 1" in done.stdout
    deadline = time.monotonic() + 15
    while True:
        left = _ours(mark)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, [p.info["cmdline"] for p in left]


@pytest.mark.parametrize("visible, count", [(None, 8), ("2,5", 2)])
def test_the_shim_in_one_process(visible, count):
    extra = {"NPUSIM_BACKEND": "local", "EXPECT_DEVICES": str(count)}
    if visible:
        extra["ASCEND_RT_VISIBLE_DEVICES"] = visible
    done = subprocess.run([sys.executable, str(SCRIPTS / "single_process.py")], check=False, capture_output=True, text=True,
                          env=env(**extra), timeout=60, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]


def test_the_core_never_imports_torch():
    code = "import sys, rt, hccl, launcher, acl, launcher.spawn; assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env(), timeout=60)
    assert done.returncode == 0, done.stderr
