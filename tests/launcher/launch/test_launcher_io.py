"""The launcher's own I/O failing under it: a full log filesystem, a rank table or profile that cannot be written,
a long TMPDIR. Each degrades or ends in a clean message (the summary box for a job), never a traceback, and leaves
nothing behind. (The `launch --up` daemon killed mid-job or stopped with SIGTERM: tests/launcher/cluster/test_cluster.py.)"""

import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from launcher.agent.ranks import STDERR, STDOUT
from launcher.launch import profile
from launcher.launch.cli import main
from launcher.launch.output import OutputRouter

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(60)


# ---- a log file that cannot be written (ENOSPC) ------------------------------------------------------------

def full_router(tmp_path, monkeypatch):
    """A router whose log files are /dev/full: every flush fails with ENOSPC, as on a full disk."""
    out, err = io.StringIO(), io.StringIO()
    router = OutputRouter(nproc=2, log_dir=tmp_path, tee=3, stdout=out, stderr=err)
    monkeypatch.setattr(router, "_file", lambda rank: router._files.setdefault(rank, open("/dev/full", "w")))
    return router, out, err


def test_a_full_log_disk_warns_once_and_the_console_keeps_every_line(tmp_path, monkeypatch):
    router, out, err = full_router(tmp_path, monkeypatch)
    router.mark_attempt(2, 0)
    for i in range(50):
        router.lines([(0, STDOUT, f"line {i}"), (1, STDERR, f"err {i}")])
    router.mark_attempt(2, 1)                                  # a restart: still no traceback, no second warning
    router.close()
    assert [f"[rank0]:line {i}" for i in range(50)] == out.getvalue().splitlines()
    notes = [line for line in err.getvalue().splitlines() if line.startswith("launch:")]
    assert len(notes) == 1 and "cannot write the rank logs" in notes[0] and "No space left" in notes[0], notes
    assert err.getvalue().count("[rank1]:err") == 50


@pytest.fixture
def tiny_fs():
    """A 64 KiB tmpfs (root only); unmounted afterwards."""
    d = tempfile.mkdtemp(prefix="npusim-tinyfs-")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", d], capture_output=True, text=True)
    if done.returncode != 0:
        os.rmdir(d)
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield Path(d)
    finally:
        subprocess.run(["umount", d], check=True)
        os.rmdir(d)


def fill(fs: Path) -> None:
    with open(fs / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


CHATTY = "import sys\nfor i in range(2000):\n    print('x' * 100, i)\nprint('last line', file=sys.stderr)\n"


def test_launch_with_log_dir_on_a_full_filesystem_runs_to_the_end(tiny_fs, tmp_path, capsys):
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)                                  # ~200 KB of output per rank into 64 KiB
    assert main(["--nproc", "2", "--log-dir", str(tiny_fs / "logs"), "--no-cards", str(script)]) == 0
    out, err = capsys.readouterr()
    assert out.count("[rank0]:") == 2000 and out.count("[rank1]:") == 2000 and "[rank1]:last line" in err
    assert err.count("cannot write the rank logs") == 1 and "Traceback" not in err, err[-2000:]


def test_a_rank_table_on_a_full_filesystem_is_a_failure_box_and_leaves_no_temp_file(tiny_fs, tmp_path, capsys):
    fill(tiny_fs)
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    assert main(["--nproc", "2", "--rank-table", str(tiny_fs / "rt.json"), "--no-cards", str(script)]) == 1
    out, err = capsys.readouterr()
    assert "ran" not in out and "Traceback" not in err
    assert "FAILED" in err and "cannot write the rank table" in err and "No space left" in err, err
    assert sorted(p.name for p in tiny_fs.iterdir()) == ["filler"]


def test_a_profile_that_does_not_fit_leaves_no_temp_file(tiny_fs, tmp_path):
    (tmp_path / "profile_rank0.json").write_text(json.dumps({"rank": 0, "events": []}))
    fill(tiny_fs)
    with pytest.raises(OSError):
        profile.write(str(tmp_path), str(tiny_fs / "job.json"))
    assert sorted(p.name for p in tiny_fs.iterdir()) == ["filler"]


def launch(env, *argv, timeout=120):
    return subprocess.run([sys.executable, "-m", "launcher", *argv], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture
def long_tmpdir():
    """A $TMPDIR of ~50 characters: too long for Ray's default session paths, short enough for the cards'."""
    scratch = tempfile.mkdtemp(prefix="npl-", dir="/tmp")
    path = Path(scratch) / ("t" * 34)
    path.mkdir()
    yield path
    subprocess.run(["rm", "-rf", scratch])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_long_tmpdir_runs_and_leaves_no_ray_session(long_tmpdir, tmp_path):
    """Ray's own default under a long $TMPDIR would exceed AF_UNIX's 107 bytes (a Ray traceback, a session
    directory and session_latest left there); the embedded session uses a directory of ours in /tmp instead."""
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    before = set(Path("/tmp").glob("npusim-ray-*"))
    env = dict(os.environ, TMPDIR=str(long_tmpdir), NPUSIM_CLUSTER="0", PYTHONPATH=str(ROOT))
    env.pop("RAY_ADDRESS", None)
    done = launch(env, "--nproc", "1", str(script), timeout=150)
    assert done.returncode == 0 and "[rank0]:ran" in done.stdout, done.stdout + done.stderr
    deadline = time.monotonic() + 30                           # the reaper may finish a moment after launch
    while set(Path("/tmp").glob("npusim-ray-*")) - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert set(Path("/tmp").glob("npusim-ray-*")) - before == set()
    assert not (long_tmpdir / "ray").exists() and list(long_tmpdir.rglob("session*")) == []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_tmpdir_too_long_for_card_sockets_still_runs_a_job_on_cards(tmp_path):
    """A $TMPDIR of 110 characters: a card's socket path inside it would pass AF_UNIX's 107 bytes, so npusim's
    per-user directory is /tmp/npusim-<uid> instead (rt/files.py), and the card calls work."""
    scratch = tempfile.mkdtemp(prefix="npl-", dir="/tmp")
    long_dir = Path(scratch) / ("t" * (110 - len(scratch)))
    long_dir.mkdir()
    script = tmp_path / "card.py"
    script.write_text("import rt\nrt.init()\nrt.set_device(0)\nprint('free', rt.get_mem_info()[0] > 0)\n")
    env = dict(os.environ, TMPDIR=str(long_dir), NPUSIM_CLUSTER="0", PYTHONPATH=str(ROOT))
    env.pop("RAY_ADDRESS", None)
    try:
        done = launch(env, "--nproc", "1", str(script), timeout=150)
        assert done.returncode == 0 and "[rank0]:free True" in done.stdout, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
    finally:
        subprocess.run(["rm", "-rf", scratch])
