"""Regression tests of the reliability probe (issue 11) for the launcher: nothing outlives a SIGKILLed
`launch` or `spawn` caller, ASCEND_RT_VISIBLE_DEVICES works under the embedded Ray, every Ray listener and
advertised address is loopback, card warnings reach the rank's stderr as warnings, and the smaller
things (sys.argv of spawned ranks, compile errors at once, every failed rank named, a log file per rank)."""

from __future__ import annotations

import json
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

import launcher
from launcher.launch.cli import main

ROOT = Path(__file__).resolve().parents[3]
SOCKET_ROOT = Path(tempfile.gettempdir()) / f"npusim-{os.getuid()}"
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}

PROBE = textwrap.dedent("""
    import json, os, sys, time, warnings
    import numpy as np
    import hccl, rt
    comm = hccl.init()
    rank = int(os.environ["RANK"])
    t = rt.Tensor.from_numpy(np.array([rank + 1], np.int64))
    comm.all_reduce(t)

    @rt.kernel
    def overflow(x, y):
        y[...] = np.exp(x * 1000)
    x = rt.Tensor.from_numpy(np.ones(4, np.float32))
    rt.launch_kernel(overflow, [x], [rt.empty(4)])
    rt.synchronize_device()
    info = {"rank": rank, "sum": int(t.numpy()[0]), "device": rt.get_device(),
            "physical": rt.get_device_info(rt.get_device()).physical_id, "count": rt.get_device_count(),
            "address": os.environ["NPUSIM_RAY_ADDRESS"], "card_dir": os.environ["NPUSIM_CARD_DIR"],
            "rank_table": os.environ["RANK_TABLE_FILE"], "pid": os.getpid(),
            "table": json.load(open(os.environ["RANK_TABLE_FILE"]))}
    path = os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(info, f)
    os.replace(path + ".tmp", path)
    time.sleep(600)
""")


def _wait_files(paths, timeout, proc):
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the job ended early ({proc.returncode}):\n{out[-2000:]}\n{err[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"ranks not ready within {timeout} s:\n{out[-2000:]}\n{err[-3000:]}")
        time.sleep(0.1)


def _alive(pids):
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{pid} {' '.join(p.cmdline())[:100]}")
        except psutil.Error:
            pass
    return out


def _socket_root_entries():
    return set(os.listdir(SOCKET_ROOT)) if SOCKET_ROOT.exists() else set()


def _ray_sessions():
    base = Path(tempfile.gettempdir()) / "ray"
    return set(os.listdir(base)) if base.exists() else set()


def _kill_and_check_nothing_left(proc, tree, leftovers, before_root, before_ray):
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = _alive(tree)
        files = [p for p in leftovers if os.path.exists(p)]
        new_dirs = (_socket_root_entries() - before_root) | (_ray_sessions() - before_ray)
        if not alive and not files and not new_dirs:
            return
        time.sleep(0.2)
    pytest.fail(f"10 s after SIGKILL: processes {alive}, files {files}, directories {sorted(new_dirs)}")


@pytest.mark.timeout(180)
def test_sigkill_of_launch_leaves_nothing_and_visible_devices_and_loopback_hold(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT_DIR": str(out), "PYTHONPATH": str(ROOT), "ASCEND_RT_VISIBLE_DEVICES": "1,3"}
    env.pop("RAY_ADDRESS", None)
    before_root, before_ray = _socket_root_entries(), _ray_sessions()
    proc = subprocess.Popen([sys.executable, "-m", "launcher", str(probe)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_files([out / "rank0.json", out / "rank1.json"], 120, proc)
        infos = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        tree = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        # ASCEND_RT_VISIBLE_DEVICES=1,3: two ranks by default, on physical cards 1 and 3, seen as devices 0 and 1
        assert [(i["device"], i["physical"], i["count"], i["sum"]) for i in infos] == [(0, 1, 2, 3), (1, 3, 2, 3)]
        table = infos[0]["table"]["server_list"][0]["device"]
        assert [(d["device_id"], d["rank_id"]) for d in table] == [("1", "0"), ("3", "1")]
        # every address Ray advertises and every socket its processes listen on is loopback
        assert infos[0]["address"].startswith("127.0.0.1:")
        listening = []
        for pid in tree:
            try:
                listening += [(pid, c.laddr.ip) for c in psutil.Process(pid).net_connections("tcp")
                              if c.status == psutil.CONN_LISTEN]
            except psutil.Error:
                pass
        assert listening and all(ip in LOOPBACK for _, ip in listening), listening
        _kill_and_check_nothing_left(proc, tree + [proc.pid],
                                     [infos[0]["card_dir"], infos[0]["rank_table"]], before_root, before_ray)
        _, err = proc.communicate()
        # the kernel's overflow warning reached the rank's stderr as a warning, not as card output under Ray's banner
        assert "RuntimeWarning: overflow encountered in exp (in a kernel task)" in err
        assert "CardActor pid=" not in err and "repeated" not in err
    finally:
        if proc.poll() is None:
            proc.kill()


SPAWN_CALLER = textwrap.dedent("""
    import os, time
    import launcher

    def sleeper(out):
        import hccl
        hccl.init()
        open(os.path.join(out, "rank" + os.environ["RANK"]), "w").close()
        time.sleep(600)

    if __name__ == "__main__":
        launcher.spawn(sleeper, nproc=2, args=(os.environ["OUT_DIR"],))
""")


@pytest.mark.timeout(180)
def test_sigkill_of_a_spawn_caller_leaves_nothing(tmp_path):
    script = tmp_path / "caller.py"
    script.write_text(SPAWN_CALLER)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT_DIR": str(out), "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    before_root, before_ray = _socket_root_entries(), _ray_sessions()
    before_tmp = set(os.listdir(tempfile.gettempdir()))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_files([out / "rank0", out / "rank1"], 120, proc)
        tree = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        _kill_and_check_nothing_left(proc, tree + [proc.pid], [], before_root, before_ray)
        left = {n for n in set(os.listdir(tempfile.gettempdir())) - before_tmp if n.startswith("npusim")}
        assert not left, f"temp files of the spawn caller remain: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.timeout(120)
def test_rt_init_with_visible_devices_starts_the_embedded_session(tmp_path):
    code = ("import rt, numpy as np; rt.init(); rt.set_device(0); p = rt.malloc(64); rt.free(p); "
            "print(rt.get_device_count(), rt.get_device_info(0).physical_id); rt.finalize()")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ASCEND_RT_VISIBLE_DEVICES": "2"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=100,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["1", "2"]
    assert "Failed to detect NPU type" not in done.stderr and "Traceback" not in done.stderr


def test_visible_devices_bound_the_ranks_per_node(tmp_path, monkeypatch, capsys):
    script = tmp_path / "s.py"
    script.write_text("print('never')\n")
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "2")
    assert main(["--no-cards", "--nproc", "2", str(script)]) == 2
    err = capsys.readouterr().err
    assert "ASCEND_RT_VISIBLE_DEVICES='2' leaves 1 visible card" in err


# ---------------------------------------------------------------- smaller things (no cards, no Ray)
def argv_of_rank():
    return list(sys.argv)


def test_spawned_ranks_see_the_callers_argv():
    got = launcher.spawn(argv_of_rank, nproc=2, _no_cards=True)
    assert got == [list(sys.argv)] * 2


def fail_everywhere(sync_dir, world):
    rank = int(os.environ["RANK"])
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})    # finish failing even while being stopped
    open(os.path.join(sync_dir, f"r{rank}"), "w").close()         # (blocked before any rank can go on and fail)
    deadline = time.monotonic() + 30
    while len(os.listdir(sync_dir)) < world and time.monotonic() < deadline:
        time.sleep(0.005)
    raise ValueError(f"rank {rank} cannot go on")


def test_launch_error_names_every_rank_that_failed(tmp_path):
    with pytest.raises(launcher.LaunchError) as e:
        launcher.spawn(fail_everywhere, nproc=4, args=(str(tmp_path), 4), _no_cards=True)
    assert sorted(f["rank"] for f in e.value.failures) == [0, 1, 2, 3]
    for r in range(4):
        assert f"ValueError: rank {r} cannot go on" in str(e.value)


def test_a_script_that_does_not_compile_fails_before_anything_starts(tmp_path, capsys):
    script = tmp_path / "broken.py"
    script.write_text("import os\n\ndef f(:\n    pass\n")
    assert main(["--nproc", "8", str(script)]) == 2            # a usage error, not 8 failed ranks
    err = capsys.readouterr().err
    assert "does not compile" in err and "line 3" in err and "SyntaxError" in err
    assert "[rank" not in err


def test_module_that_does_not_compile_fails_before_anything_starts(tmp_path, monkeypatch, capsys):
    (tmp_path / "brokenmod.py").write_text("x = (\n")
    monkeypatch.chdir(tmp_path)
    assert main(["--no-cards", "--nproc", "2", "-m", "brokenmod"]) == 2
    assert "does not compile" in capsys.readouterr().err


def test_log_dir_has_a_file_for_every_rank(tmp_path, capsys):
    script = tmp_path / "quiet.py"
    script.write_text("import os\nif os.environ['RANK'] == '0':\n    print('only rank 0 speaks')\n")
    logs = tmp_path / "logs"
    assert main(["--no-cards", "--nproc", "3", "--log-dir", str(logs), str(script)]) == 0
    assert sorted(os.listdir(logs)) == ["rank0.log", "rank1.log", "rank2.log"]
    assert (logs / "rank0.log").read_text() == "only rank 0 speaks\n"
    assert (logs / "rank1.log").read_text() == ""
