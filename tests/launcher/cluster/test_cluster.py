"""The persistent local cluster (`launch --up` / `--down`) and the pytest plugin (`npu_spawn`), run as users run
them: subprocesses in a private temp dir, so a developer's own cluster is never touched."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(170)]

HELLO = textwrap.dedent("""
    import os, hccl, rt, numpy as np
    comm = hccl.init()
    t = rt.Tensor.from_numpy(np.full(4, float(os.environ["RANK"]) + 1, np.float32))
    comm.all_reduce(t)
    print("sum", t.numpy()[0], "dir", os.environ["NPUSIM_CARD_DIR"])
""")


@pytest.fixture
def private_tmp():
    d = tempfile.mkdtemp(prefix="npc-", dir="/tmp")            # short: Ray's socket paths must stay < 108 bytes
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "NPUSIM_BACKEND", "NPUSIM_CARD_DIR",
                                                              "ASCEND_RT_VISIBLE_DEVICES")}
    # two cards a node: the daemon boots (and every job resets) two card actors, not eight — the jobs use two
    config = Path(d) / "two.toml"
    config.write_text("[node]\ncards = 2\n")
    env.update(TMPDIR=d, NPUSIM_CLUSTER="1", NPUSIM_CONFIG=str(config))
    yield d, env
    subprocess.run([sys.executable, "-m", "launcher", "--down"], env=env, capture_output=True, timeout=90)
    subprocess.run(["rm", "-rf", d])


def run(env, *argv, timeout=120):
    return subprocess.run([sys.executable, "-m", "launcher", *argv], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


BORROWER = textwrap.dedent("""
    import time, hccl, rt, numpy as np
    comm = hccl.init()
    print("ready", flush=True)
    time.sleep(60)              # still borrowing when the test kills the daemon (launch ends the job at once)
    comm.all_reduce(rt.Tensor.from_numpy(np.ones(4, np.float32)))
""")


def daemon_pid(env) -> int:
    status = run(env, "--status")
    assert status.returncode == 0, status.stdout + status.stderr
    return int(status.stdout.split("pid ")[1].split(",")[0])


def wait_gone(pid: int, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:                  # reaped by init between two looks: gone all the same
            return
        assert time.monotonic() < deadline, f"the daemon, pid {pid}, is still alive after {limit} s"
        time.sleep(0.1)


def leftovers(tmp: str) -> list[str]:
    root = Path(tmp) / f"npusim-{os.getuid()}"
    return sorted(str(p.relative_to(tmp)) for p in root.rglob("*")) if root.exists() else []


def test_up_serves_jobs_and_a_daemon_killed_mid_job_or_left_stale_is_handled(private_tmp):
    """One daemon's life: up (idempotent), two jobs on the same warm cards, status; then SIGKILL while a job
    borrows its cards — the job ends in the failure box, naming it, and the daemon's state goes at once; a stale
    state file (a daemon killed while nobody borrowed it) is ignored: the next job starts its own session."""
    tmp, env = private_tmp
    script, borrower = Path(tmp) / "hello.py", Path(tmp) / "borrow.py"
    script.write_text(HELLO)
    borrower.write_text(BORROWER)
    up = run(env, "--up")
    assert up.returncode == 0 and "local cluster up" in up.stdout, up.stdout + up.stderr
    assert "already up" in run(env, "--up").stdout                       # idempotent
    dirs = set()
    for _ in range(2):
        job = run(env, "--nproc", "2", str(script))
        assert job.returncode == 0, job.stdout + job.stderr
        assert "npusim: using the local cluster (pid" in job.stderr
        assert "[rank0]:sum 3.0" in job.stdout
        dirs.add(job.stdout.split(" dir ")[1].split()[0])
    assert len(dirs) == 1                                                # the same warm cards served both
    status = run(env, "--status")
    assert status.returncode == 0 and "2 jobs served" in status.stdout, status.stdout

    pid = daemon_pid(env)
    state = Path(tmp) / f"npusim-{os.getuid()}" / "cluster" / "cluster.json"
    saved = state.read_text()
    job = subprocess.Popen([sys.executable, "-m", "launcher", "--nproc", "2", str(borrower)], env=env, cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "ready" in job.stdout.readline()                # the job holds the cluster's cards now
        os.kill(pid, signal.SIGKILL)
        out, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 1, out + err
    assert "using the local cluster" in err and "stopped answering" in err and "FAILED" in err, err
    assert "BrokenPipeError" not in err and "launcher/cluster/" not in err, err
    left = leftovers(tmp)                                      # its state and socket are gone now, not next launch
    assert not any(name.endswith(("cluster.json", "cluster.sock")) for name in left), left

    state.write_text(saved)                                    # as a daemon SIGKILLed while idle leaves it
    job = run(env, "--nproc", "2", str(script))
    assert job.returncode == 0, job.stdout + job.stderr
    assert "using the local cluster" not in job.stderr and "[rank0]:sum 3.0" in job.stdout
    assert run(env, "--status").returncode == 1                          # reported as not running
    assert run(env, "--down").returncode == 0


@pytest.mark.timeout(240)
def test_down_and_sigterm_stop_everything(private_tmp):
    tmp, env = private_tmp
    assert run(env, "--up").returncode == 0
    pid = daemon_pid(env)
    kids = [c.pid for c in psutil.Process(pid).children(recursive=True)]
    assert kids                                                          # Ray and its card workers
    down = run(env, "--down")
    assert down.returncode == 0 and "stopped" in down.stdout
    gone = psutil.wait_procs([psutil.Process(p) for p in kids if psutil.pid_exists(p)], timeout=20)[1]
    assert not [p.pid for p in gone if p.status() != psutil.STATUS_ZOMBIE]
    assert not os.path.exists(os.path.join(tmp, f"npusim-{os.getuid()}", "cluster"))

    assert run(env, "--up").returncode == 0                              # SIGTERM: the same, and no session left
    pid = daemon_pid(env)
    os.kill(pid, signal.SIGTERM)
    wait_gone(pid, 60)
    deadline = time.monotonic() + 30                           # the reaper may finish a moment after the daemon
    while leftovers(tmp) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(tmp) == []
    assert run(env, "--status").returncode == 1


PLUGIN_TESTS = textwrap.dedent("""
    import os, time
    import numpy as np
    import pytest
    import launcher

    def reduce_rank():
        import hccl, rt
        comm = hccl.init()
        t = rt.Tensor.from_numpy(np.full(2, float(os.environ["RANK"]), np.float32))
        comm.all_reduce(t)
        return float(t.numpy()[0])

    def slow():
        time.sleep(30)

    def boom():
        if os.environ["RANK"] == "2":
            raise KeyError("rank two")
        return 0

    @pytest.mark.parametrize("n", [2, 4, 8])
    def test_sum(npu_spawn, n):
        assert npu_spawn(reduce_rank, nproc=n) == [n * (n - 1) / 2] * n

    def test_failure_names_the_rank(npu_spawn):
        with pytest.raises(launcher.LaunchError) as e:
            npu_spawn(boom, nproc=4)
        assert "rank 2" in str(e.value) and "KeyError" in str(e.value)

    @pytest.mark.npu_timeout(2)
    def test_deadline(npu_spawn):
        with pytest.raises(launcher.LaunchError) as e:
            npu_spawn(slow, nproc=2)
        assert e.value.status == "timeout"
""")


def test_the_pytest_plugin_runs_distributed_tests_on_warm_cards(private_tmp):
    tmp, env = private_tmp
    env["NPUSIM_CLUSTER"] = "0"                                          # the plugin's own embedded session
    env.pop("NPUSIM_CONFIG")                                             # of eight cards: a test uses 8 ranks
    (Path(tmp) / "test_dist.py").write_text(PLUGIN_TESTS)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_dist.py"],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "5 passed" in done.stdout
