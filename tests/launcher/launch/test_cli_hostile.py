"""Hostile values for every flag of `launch` and `hccl-test`: each is a usage error — exit 2 and one line on
stderr naming the flag — found before Ray or any rank starts, never a traceback, a crash or a hang."""

import os
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest

from launcher.launch.cli import main
from launcher.tools import hccl_test

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(60)

# (flags, what the one error line must contain); each runs as `launch FLAGS --no-cards script.py`
LAUNCH_CASES = [
    (["--nproc", "²"], "--nproc"),                                # isdigit() is True, int() fails
    (["--nproc", "111111111111"], "--nproc"),
    (["--nproc", "-3"], "--nproc"),
    (["--nproc", "1" * 5000], "--nproc"),                         # past int()'s 4300-digit limit
    (["--nnodes", "²"], "--nnodes"),
    (["--nnodes", str(2 ** 40)], "--nnodes"),
    (["--max-restarts", str(2 ** 63)], "--max-restarts"),
    (["--max-restarts", "-1"], "--max-restarts"),
    (["--timeout", "inf"], "--timeout"),
    (["--timeout", "1e400"], "--timeout"),                        # float() makes it inf
    (["--timeout", "nan"], "--timeout"),
    (["--timeout", "0"], "--timeout"),
    (["--timeout", "x" * 5000], "--timeout"),
    (["--grace-period", "inf"], "--grace-period"),
    (["--grace-period", "1e300"], "--grace-period"),             # a finite wait threading cannot take
    (["--grace-period", "-1"], "--grace-period"),
    (["--tee", "7"], "--tee"),
    (["--tee", "9" * 30], "--tee"),
    (["--master-port", "0"], "--master-port"),
    (["--master-port", "9" * 30], "--master-port"),
    (["--nproc", "2", "--local-ranks-filter", "²"], "--local-ranks-filter"),
    (["--nproc", "2", "--local-ranks-filter", "9" * 5000], "--local-ranks-filter"),
    (["--nproc", "2", "--local-ranks-filter", "0,5"], "--local-ranks-filter"),
    (["--nproc", "2", "--inject", "kill:rank=11111111111111111111:collective=1"], "--inject"),
    (["--nproc", "2", "--inject", "kill:rank=0:collective=" + "1" * 5000], "--inject"),
    (["--nproc", "2", "--inject", "fail:rank=0:collective=1:code=" + "9" * 5000], "--inject"),
    (["--nproc", "2", "--inject", "kill:rank=5:collective=1"], "--inject"),
    (["--config", "x" * 5000], "--config"),
    (["--config", "a/" + "y" * 300 + ".toml"], "--config"),
    (["--log-dir", "/proc/x"], "--log-dir"),
    (["--log-dir", "/proc/self/status"], "--log-dir"),           # exists, not a directory
    (["--rank-table", "/nonexistent/dir/rt.json"], "--rank-table"),
    (["--profile", "/nonexistent/dir/p.json"], "--profile"),
    (["--profile", "/tmp/" + "y" * 300], "--profile"),           # a name longer than NAME_MAX
    (["--rank-table", "/tmp/" + "y" * 300 + "/rt.json"], "--rank-table"),
    (["--log-dir", "/tmp/" + "y" * 300], "--log-dir"),
    (["--log-dir", "/" + "z/" * 3000], "--log-dir"),             # longer than PATH_MAX
]


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "ok.py"
    path.write_text("print('ran')\n")
    return str(path)


def one_error_line(err: str, needle: str, prog: str = "launch") -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: error: ") and needle in lines[0], err
    assert "Traceback" not in err and len(lines[0]) < 2000, err


@pytest.mark.parametrize("flags,needle", LAUNCH_CASES, ids=[" ".join(c[0])[:40] for c in LAUNCH_CASES])
def test_hostile_flag_is_one_usage_line(flags, needle, script, capsys):
    assert main([*flags, "--no-cards", script]) == 2
    out, err = capsys.readouterr()
    assert "ran" not in out
    one_error_line(err, needle)


@pytest.mark.parametrize("flag", ["--rank-table", "--profile"])
def test_an_output_file_that_is_a_directory_is_refused_and_nothing_is_left(flag, tmp_path, script, capsys):
    target = tmp_path / "out"
    target.mkdir()
    assert main([flag, str(target), "--nproc", "1", "--no-cards", script]) == 2
    one_error_line(capsys.readouterr().err, flag)
    assert list(tmp_path.glob(".*.tmp")) == [] and list(target.iterdir()) == []


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_hostile_config_files(tmp_path, script, capsys):
    """Configs that load_config refuses (rt/config.py); the launcher turns each into one line and exit 2."""
    configs = [
        write(tmp_path, "long.toml", '[card]\nhbm_bytes = "' + "9" * 5000 + '"\n'),
        write(tmp_path, "bigint.toml", "[card]\nhbm_bytes = " + "9" * 5000 + "\n"),
        write(tmp_path, "unknown.toml", "[card]\nhbm = 1\n"),
        write(tmp_path, "deep.toml", "x = " + "[" * 5000 + "]" * 5000 + "\n"),     # RecursionError in tomllib
    ]
    for config in configs:
        assert main(["--config", config, "--no-cards", script]) == 2, config
        one_error_line(capsys.readouterr().err, "config")


def test_an_object_store_the_machine_cannot_hold_is_refused_before_ray(tmp_path, script, capsys, monkeypatch):
    from rt.ray import session
    started = []
    monkeypatch.setattr(session, "start_local_ray", lambda cfg: started.append(cfg))   # (this process may have one)
    config = write(tmp_path, "huge.toml", f"[ray]\nobject_store_bytes = {1 << 40}\n")
    assert main(["--config", config, "--nproc", "1", script]) == 2        # with cards: would start Ray
    err = capsys.readouterr().err
    one_error_line(err, "object_store_bytes = 1099511627776")
    assert "fits" in err
    assert not started                                                    # refused before any Ray start


def test_as_a_command_the_error_is_one_line_without_traceback(script):
    env = dict(os.environ, PYTHONPATH=str(ROOT), NPUSIM_CLUSTER="0")
    done = subprocess.run([sys.executable, "-m", "launcher", "--nproc", "²", script], env=env,
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 2 and done.stdout == ""
    one_error_line(done.stderr, "--nproc '²'")


HCCL_TEST_CASES = [
    (["-b", "inf"], "-b"),
    (["-b", "1e400"], "-b"),
    (["-b", "nan"], "-b"),
    (["-e", "2T"], "-e"),
    (["-e", "1" * 5000], "-e"),
    (["-b", "0", "-e", "1G", "-i", "1"], "walks 1073741825 sizes"),   # a billion-entry size list
    (["-F", "/nonexistent/x.csv"], "-F"),                            # checked now, not after the run
    (["-F", "/"], "-F"),
    (["-p", "²"], "-p"),
    (["-p", "100"], "100"),
    (["--timeout", "inf"], "--timeout"),
]


@pytest.mark.parametrize("flags,needle", HCCL_TEST_CASES, ids=[" ".join(c[0])[:40] for c in HCCL_TEST_CASES])
def test_hccl_test_hostile_flag_is_one_usage_line(flags, needle, capsys):
    assert hccl_test.main(["all_reduce", "-p", "2", *flags]) == 2
    one_error_line(capsys.readouterr().err, needle, prog="hccl-test")


def test_launch_up_refuses_bad_configs_before_starting_a_daemon(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))      # a private per-user dir: no real cluster is seen
    huge = write(tmp_path, "huge.toml", f"[ray]\nobject_store_bytes = {1 << 40}\n")
    for argv, needle in ((["--up", "--config", "x" * 5000], "--config"), (["--up", "--config", huge], "fits"),
                         (["--up", "--nproc", "2"], "--up"), (["--status", "x"], "--status")):
        assert main(argv) == 2, argv
        one_error_line(capsys.readouterr().err, needle)
    assert not (tmp_path / f"npusim-{os.getuid()}" / "cluster" / "cluster.json").exists()


def test_a_refused_request_creates_no_log_dir(tmp_path, script, capsys):
    logs = tmp_path / "logs"
    assert main(["--log-dir", str(logs), "--master-port", "0", "--no-cards", script]) == 2
    one_error_line(capsys.readouterr().err, "--master-port")
    assert not logs.exists()


@pytest.mark.parametrize("target", [["/tmp/" + "y" * 300], ["/proc/1/root/x.py"], ["nonexistent" * 500 + ".py"],
                                    ["-m", "a\0b"], ["-m", "a-b"], ["-m", "y" * 300 + "."], ["-m", ""]])
def test_a_hostile_script_or_module_is_one_usage_line(target, capsys):
    assert main(["--nproc", "2", "--no-cards", *target]) == 2
    out, err = capsys.readouterr()
    assert "[rank" not in out + err
    one_error_line(err, "launch -m" if target[0] == "-m" else "script")
