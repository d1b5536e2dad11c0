"""`launch` end to end in the internal no-cards mode (no Ray): env, output, failures, restarts, signals."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from hccl import ranktable
from launcher.launch.cli import main

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(60)
LINE = re.compile(r"^\[rank(\d+)\]:(.*)$")

ENV_KEYS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "RANK_ID", "RANK_SIZE",
            "DEVICE_ID", "ASCEND_DEVICE_ID", "RANK_TABLE_FILE", "RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT", "NPUSIM_JOB",
            "NPUSIM_NODE", "NPUSIM_CONFIG", "OMP_NUM_THREADS"]

DUMP_ENV = textwrap.dedent(f"""
    import json, os, sys
    env = {{k: os.environ.get(k) for k in {ENV_KEYS!r}}}
    env["pid"] = os.getpid()
    env["argv"] = sys.argv[1:]
    out = os.path.join(os.environ["OUT_DIR"], f"env{{env['RANK']}}.{{env['RESTART_COUNT']}}.json")
    with open(out + ".part", "w") as f:
        json.dump(env, f)
    os.rename(out + ".part", out)           # a test polling for the file sees it whole or not at all
    print("ENV", json.dumps(env))
    print("err line", file=sys.stderr)
""")


def script(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def rank_lines(text):
    """{rank: [line, ...]} from prefixed console output."""
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            out.setdefault(int(m.group(1)), []).append(m.group(2))
    return out


@pytest.fixture
def out_dir(tmp_path, monkeypatch):
    d = tmp_path / "out"
    d.mkdir()
    monkeypatch.setenv("OUT_DIR", str(d))
    return d


def test_eight_ranks_get_the_documented_environment(tmp_path, out_dir, capsys):
    path = script(tmp_path, "env.py", DUMP_ENV)
    assert main(["--no-cards", "--nproc", "8", path, "--flag", "x y"]) == 0
    stdout, stderr = capsys.readouterr()
    lines = rank_lines(stdout)
    assert sorted(lines) == list(range(8))
    assert rank_lines(stderr) == {r: ["err line"] for r in range(8)}
    jobs = set()
    for rank in range(8):
        env = json.loads(lines[rank][0][len("ENV "):])
        expected = {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": 8, "LOCAL_WORLD_SIZE": 8, "NODE_RANK": 0,
                    "RANK_ID": rank, "RANK_SIZE": 8, "DEVICE_ID": rank, "ASCEND_DEVICE_ID": rank,
                    "RESTART_COUNT": 0, "NPUSIM_NODE": 0}
        assert {k: int(env[k]) for k in expected} == expected
        assert env["argv"] == ["--flag", "x y"]
        assert env["MASTER_ADDR"] == "127.0.0.1" and 0 < int(env["MASTER_PORT"]) < 65536
        assert env["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS", "1")
        assert env["NPUSIM_CONFIG"] == str(ROOT / "configs" / "default.toml")
        jobs.add(env["NPUSIM_JOB"])
        # The rank table existed while the job ran and is gone with the job's temp dir.
        assert not Path(env["RANK_TABLE_FILE"]).exists()
    assert len(jobs) == 1 and jobs != {None}


@pytest.mark.parametrize("flag", ["--master-port", "--master_port"])
def test_master_port_and_addr_as_torchrun_takes_them(tmp_path, out_dir, capsys, flag):
    path = script(tmp_path, "env.py", DUMP_ENV)
    assert main(["--no-cards", "--nproc", "2", flag, "29533", "--master-addr", "localhost", path]) == 0
    for line in [ls[0] for ls in rank_lines(capsys.readouterr()[0]).values()]:
        env = json.loads(line[len("ENV "):])
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("localhost", "29533")


def test_two_nodes_place_rank_r_on_node_r_div_nproc(tmp_path, out_dir, capsys):
    path = script(tmp_path, "env.py", DUMP_ENV)
    table_path = tmp_path / "table.json"
    assert main(["--no-cards", "--nnodes", "2", "--nproc", "3", "--rank-table", str(table_path), path]) == 0
    table = ranktable.load_rank_table(table_path)
    assert json.loads(table.text)["server_count"] == "2"
    for rank in range(6):
        env = json.loads((out_dir / f"env{rank}.0.json").read_text())
        assert (int(env["NODE_RANK"]), int(env["LOCAL_RANK"]), int(env["WORLD_SIZE"])) == (rank // 3, rank % 3, 6)
        assert env["RANK_TABLE_FILE"] == str(table_path)
        server, device = table.devices[rank]
        assert (server, table.servers[server], device) == (rank // 3, f"node_{rank // 3}", rank % 3)


FAIL_ON_RANK_2 = textwrap.dedent("""
    import os, time
    print("started", flush=True)
    if os.environ["RANK"] == "2" and int(os.environ["RESTART_COUNT"]) < int(os.environ.get("FAIL_UNTIL", "99")):
        time.sleep(0.2)
        def deep_helper():
            raise ValueError("rank 2 cannot continue")
        deep_helper()
    if os.environ.get("STAY") == "1":
        time.sleep(120)
""")


def test_failing_rank_stops_the_others_and_is_named_in_the_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STAY", "1")  # the healthy ranks would sleep 120 s: the pytest timeout proves they were stopped
    path = script(tmp_path, "fail.py", FAIL_ON_RANK_2)
    assert main(["--no-cards", "--nproc", "4", "--grace-period", "2", path]) == 1
    stdout, stderr = capsys.readouterr()
    box = stderr[stderr.index("=" * 20):]
    assert "fail.py FAILED" in box
    root = box[box.index("Root Cause"):]
    assert "rank      : 2 (local_rank: 2)" in root
    assert "exitcode  : 1" in root
    assert "deep_helper()" in root and "ValueError: rank 2 cannot continue" in root
    assert "<NO_OTHER_FAILURES>" in box


def test_max_restarts_restarts_the_group_with_restart_count(tmp_path, out_dir, monkeypatch, capsys):
    monkeypatch.setenv("FAIL_UNTIL", "1")  # rank 2 fails on the first attempt only
    path = script(tmp_path, "fail.py", FAIL_ON_RANK_2 + DUMP_ENV)
    assert main(["--no-cards", "--nproc", "3", "--max-restarts", "1", path]) == 0
    restart_counts = sorted(int(json.loads(p.read_text())["RESTART_COUNT"]) for p in out_dir.glob("env*.json"))
    # Attempt 0: ranks 0 and 1 may or may not reach the dump before being stopped; attempt 1: all three.
    assert restart_counts.count(1) == 3
    assert "restarting all 3 ranks (restart 1 of 1)" in capsys.readouterr().err


def test_restarts_exhausted_reports_failure(tmp_path, capsys):
    path = script(tmp_path, "fail.py", FAIL_ON_RANK_2)
    assert main(["--no-cards", "--nproc", "3", "--max-restarts", "2", path]) == 1
    stdout, stderr = capsys.readouterr()
    assert stderr.count("restarting all 3 ranks") == 2
    assert "after 2 restart(s)" in stderr and "ValueError: rank 2 cannot continue" in stderr
    assert sum(line == "started" for lines in rank_lines(stdout).values() for line in lines) >= 3 * 2 + 1


def test_signal_death_reported_with_signal_name(tmp_path, capsys):
    path = script(tmp_path, "kill.py", """
        import os, signal, time
        if os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)
    """)
    assert main(["--no-cards", "--nproc", "2", path]) == 1
    stderr = capsys.readouterr().err
    assert "exitcode  : -9" in stderr and "Signal 9 (SIGKILL)" in stderr and "rank      : 1" in stderr


def test_rank_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path, capsys):
    path = script(tmp_path, "stubborn.py", """
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: print("ignoring SIGTERM", flush=True))
        print("ready", flush=True)
        if os.environ["RANK"] == "0":
            time.sleep(0.3)
            sys.exit(7)
        while True:
            time.sleep(1)
    """)
    assert main(["--no-cards", "--nproc", "2", "--grace-period", "0.5", path]) == 1
    stdout, stderr = capsys.readouterr()
    assert "ignoring SIGTERM" in rank_lines(stdout)[1]
    assert "exitcode  : 7" in stderr


def test_filter_and_log_dir_keep_every_line_and_partial_lines(tmp_path, capsys):
    n_lines = 20000
    path = script(tmp_path, "chatty.py", f"""
        import os, sys
        rank = int(os.environ["RANK"])
        for i in range({n_lines}):
            print(f"r{{rank}} line {{i}} " + "x" * (i % 50))
        sys.stderr.write(f"r{{rank}} dying mid-line")
        sys.stderr.flush()
        os._exit(0)
    """)
    log_dir = tmp_path / "logs"
    assert main(["--no-cards", "--nproc", "4", "--local-ranks-filter", "0,3", "--log-dir", str(log_dir), path]) == 0
    stdout, stderr = capsys.readouterr()
    lines = rank_lines(stdout)
    assert sorted(lines) == [0, 3]
    for rank in range(4):
        expected = [f"r{rank} line {i} " + "x" * (i % 50) for i in range(n_lines)]
        logged = (log_dir / f"rank{rank}.log").read_text().splitlines()
        assert [line for line in logged if "dying" not in line] == expected
        assert logged.count(f"r{rank} dying mid-line") == 1
        if rank in (0, 3):
            assert lines[rank] == expected
    assert rank_lines(stderr) == {0: ["r0 dying mid-line"], 3: ["r3 dying mid-line"]}


def test_tee_selects_streams_for_log_files(tmp_path):
    path = script(tmp_path, "both.py", """
        import sys
        print("to out"); print("to err", file=sys.stderr)
    """)
    log_dir = tmp_path / "logs"
    assert main(["--no-cards", "--nproc", "1", "--tee", "2", "--log-dir", str(log_dir), path]) == 0
    assert (log_dir / "rank0.log").read_text() == "to err\n"


def test_module_mode_runs_module_as_main(tmp_path, monkeypatch, capsys):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text("import sys\nprint('module main', __name__, sys.argv[1:])\n")
    monkeypatch.chdir(tmp_path)
    assert main(["--no-cards", "--nproc", "2", "-m", "mypkg.job", "a"]) == 0
    assert rank_lines(capsys.readouterr().out) == {r: ["module main __main__ ['a']"] for r in range(2)}


def test_timeout_stops_the_job(tmp_path, capsys):
    path = script(tmp_path, "sleep.py", "import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    assert main(["--no-cards", "--nproc", "2", "--timeout", "1", path]) == 124
    assert "TIMED OUT" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["missing_script.py"], "not found"),
    (["--nproc", "0", "{script}"], "--nproc 0: expected a positive number"),
    (["--nproc", "9", "{script}"], "more ranks per node than the 8 cards"),
    (["--nproc", "2", "--local-ranks-filter", "5", "{script}"], "--local-ranks-filter '5'"),
    (["--max-restarts", "-1", "{script}"], "--max-restarts -1"),
    (["--master-port", "70000", "{script}"], "--master-port 70000: expected a TCP port"),
    (["--config", "{bad_config}", "{script}"], "unknown key ['node'] 'cardz'"),
    (["--config", "no_such_config", "{script}"], "config 'no_such_config' not found"),
])
def test_bad_input_fails_with_a_clear_message(tmp_path, capsys, args, message):
    bad = tmp_path / "bad.toml"
    bad.write_text("[node]\ncardz = 8\n")
    path = script(tmp_path, "ok.py", "print('never')\n")
    argv = ["--no-cards"] + [a.format(script=path, bad_config=bad) for a in args]
    assert main(argv) == 2
    stdout, stderr = capsys.readouterr()
    assert message in stderr and "never" not in stdout


def test_more_nodes_than_the_callers_session_has_is_refused_at_once(tmp_path, capsys, ray_session):
    """In a Ray session of the caller's (one node here) the nodes are Ray nodes: too few is refused, naming
    them. (launch's own embedded session simulates the nodes instead: test_simulated_nodes.py.)"""
    path = script(tmp_path, "ok.py", "print('never')\n")
    assert main(["--nnodes", "2", "--nproc", "2", path]) == 1
    out, err = capsys.readouterr()
    assert "needs 2 Ray node(s)" in err and "never" not in out, err


def test_help_is_the_user_manual(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    for word in ["--nproc", "--max-restarts", "RANK_TABLE_FILE", "NPUSIM_CARD_DIR", "Exit status"]:
        assert word in text


def _alive_after(pids, timeout):
    """The pids still running (zombies count as dead) after waiting up to timeout for them to go."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    still = []
    for p in alive:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                still.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return still


def test_ctrl_c_leaves_no_rank_process_or_temp_file(tmp_path, out_dir):
    path = script(tmp_path, "sleepy.py", DUMP_ENV + textwrap.dedent("""
        import subprocess, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        tmp = os.path.join(os.environ["OUT_DIR"], f".child{env['RANK']}")
        with open(tmp, "w") as f:
            f.write(str(child.pid))
        os.rename(tmp, os.path.join(os.environ["OUT_DIR"], f"child{env['RANK']}"))   # seen whole or not at all
        time.sleep(120)
    """))
    shm_before = set(os.listdir("/dev/shm"))
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "PYTHONPATH": str(ROOT)}
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "--no-cards", "--nproc", "4", path],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    deadline = time.monotonic() + 30
    while len(list(out_dir.glob("child*"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [json.loads(p.read_text())["pid"] for p in out_dir.glob("env*.json")]
    pids += [int(p.read_text()) for p in out_dir.glob("child*")]
    assert len(pids) == 8
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert b"INTERRUPTED" in stderr and b"SIGINT" in stderr
    assert _alive_after(pids, timeout=5) == []
    assert list((tmp_path / "tmp").iterdir()) == []
    assert set(os.listdir("/dev/shm")) - shm_before == set()


def test_killed_launcher_takes_its_ranks_along(tmp_path, out_dir):
    path = script(tmp_path, "sleepy.py", DUMP_ENV + "import time\ntime.sleep(120)\n")
    # A SIGKILLed launch cannot remove its temp dir: keep it inside tmp_path.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "--no-cards", "--nproc", "3", path],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 30
    while len(list(out_dir.glob("env*.json"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [json.loads(p.read_text())["pid"] for p in out_dir.glob("env*.json")]
    assert len(pids) == 3
    proc.kill()  # no cleanup code runs: PR_SET_PDEATHSIG must do it
    proc.wait(timeout=10)
    assert _alive_after(pids, timeout=10) == []
