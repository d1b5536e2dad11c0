"""`launch` with real card actors. The test process never imports Ray: `launch` runs as a subprocess and
starts (and must stop) its own embedded session — the only Ray this file starts."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("rt.ray.session") is None,
                                reason="rt.ray.session (card actors) not available")

PROBE = textwrap.dedent("""
    import json, os, runpy, sys
    rank = os.environ["RANK"]
    card_dir = os.environ.get("NPUSIM_CARD_DIR", "")
    info = {k: os.environ.get(k) for k in ("RANK", "DEVICE_ID", "WORLD_SIZE", "NPUSIM_CARD_DIR", "NPUSIM_JOB",
                                           "NPUSIM_RAY_ADDRESS", "RANK_TABLE_FILE")}
    info["card_dir_exists"] = os.path.isdir(card_dir)
    info["rank_table"] = json.load(open(os.environ["RANK_TABLE_FILE"]))
    info["pid"] = os.getpid()
    with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as f:
        json.dump(info, f)
    try:
        import hccl
        have_hccl = hasattr(hccl, "init")
    except ImportError:
        have_hccl = False
    if have_hccl:
        runpy.run_path(os.environ["HELLO"], run_name="__main__")
    else:
        print("NOHCCL")
""")


def _ray_processes_of(gcs_address):
    port = gcs_address.rsplit(":", 1)[1]
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["status"] != psutil.STATUS_ZOMBIE and (f"gcs_server_port={port}" in cmd or f":{port}" in cmd):
            found.append((p.pid, cmd[:120]))
    return found


@pytest.mark.timeout(240)
def test_launch_eight_ranks_on_real_cards_and_clean_up(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    shm_before = set(os.listdir("/dev/shm"))
    env = {**os.environ, "OUT_DIR": str(out_dir), "HELLO": str(ROOT / "examples" / "hello.py"),
           "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-m", "launcher", "--nproc", "8", str(probe)],
                          capture_output=True, text=True, env=env, timeout=200, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    infos = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(8)]
    assert [(int(i["RANK"]), int(i["DEVICE_ID"]), int(i["WORLD_SIZE"])) for i in infos] == [(r, r, 8) for r in range(8)]
    assert all(i["card_dir_exists"] for i in infos)
    assert len({i["NPUSIM_CARD_DIR"] for i in infos}) == 1 and len({i["NPUSIM_JOB"] for i in infos}) == 1
    assert [d["rank_id"] for d in infos[0]["rank_table"]["server_list"][0]["device"]] == [str(r) for r in range(8)]
    lines = [line for line in done.stdout.splitlines() if line.startswith("[rank")]
    if "NOHCCL" in done.stdout:
        assert sorted(lines) == sorted(f"[rank{r}]:NOHCCL" for r in range(8))
    else:  # hello.py ran: every rank saw the sum 0 + 1 + ... + 7
        assert sum("all_reduce(sum of ranks) = 28" in line for line in lines) == 8
    # Nothing outlives launch: card sockets, ranks, the embedded Ray, shared memory.
    assert not Path(infos[0]["NPUSIM_CARD_DIR"]).exists()
    assert not any(psutil.pid_exists(i["pid"]) and psutil.Process(i["pid"]).status() != psutil.STATUS_ZOMBIE
                   for i in infos)
    assert _ray_processes_of(infos[0]["NPUSIM_RAY_ADDRESS"]) == []
    assert set(os.listdir("/dev/shm")) - shm_before == set()


@pytest.mark.timeout(60)
def test_unreachable_address_fails_fast_with_the_address_named(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("print('never')\n")
    done = subprocess.run([sys.executable, "-m", "launcher", "--address", "127.0.0.1:1", "--nproc", "2",
                           str(script)], capture_output=True, text=True, timeout=50,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1
    assert "127.0.0.1:1" in done.stderr and "never" not in done.stdout


COPY_PROBE = textwrap.dedent("""
    import json, os, sys
    import rt
    from rt.host.runtime import RUNTIME

    def started_with(pid):
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\\0") if b"=" in item)
        return env.get(b"GLIBC_TUNABLES", b"").decode()

    rt.init()
    rt.set_device(int(os.environ["DEVICE_ID"]))
    card_pid = RUNTIME.current.client.info["pid"]
    print("TUNABLES " + json.dumps({"rank": started_with(os.getpid()), "card": started_with(card_pid)}))
""")


@pytest.mark.timeout(240)
@pytest.mark.skipif(not __import__("rt.copytune").copytune.applies(), reason="glibc on x86-64 only")
def test_ranks_and_cards_start_with_non_temporal_copies(tmp_path):
    """Every rank process (forked from the fork server or not) and every card process starts with glibc's
    non-temporal threshold of ``NPUSIM_NT_COPY_BYTES`` (rt/copytune.py): what the process was started with, as
    /proc shows it (glibc reads it before ``main``; a variable set after a fork changes nothing). With tunables
    of the user's first, glibc splits the original string in place, so /proc shows only the first: the merge is
    tests/rt/test_copytune.py's."""
    probe = tmp_path / "probe.py"
    probe.write_text(COPY_PROBE)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NPUSIM_NT_COPY_BYTES": "0x100000"}
    env.pop("RAY_ADDRESS", None)
    env.pop("GLIBC_TUNABLES", None)
    done = subprocess.run([sys.executable, "-m", "launcher", "--nproc", "2", str(probe)],
                          capture_output=True, text=True, env=env, timeout=200, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = [json.loads(line.split("TUNABLES ", 1)[1]) for line in done.stdout.splitlines() if "TUNABLES " in line]
    assert len(seen) == 2, done.stdout[-3000:]
    want = "glibc.cpu.x86_non_temporal_threshold=0x100000"
    assert all(s == {"rank": want, "card": want} for s in seen), seen


UNBOOTED_PROBE = textwrap.dedent("""
    import os, time, rt
    rt.init()
    t = time.monotonic()
    try:
        rt.set_device(3)
        print("UNBOOTED accepted")
    except rt.NpuError as e:
        print(f"UNBOOTED {e.code} {time.monotonic() - t:.1f} {e.message}")
    rt.set_device(int(os.environ["LOCAL_RANK"]))
""")


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_card_the_job_did_not_boot_is_refused_at_once(tmp_path):
    """`launch --nproc 2` boots cards 0 and 1; a rank asking for card 3 hears so at once (it used to wait the whole
    card-boot timeout, 60 s, for a socket that never comes), and its own card still works."""
    probe = tmp_path / "probe.py"
    probe.write_text(UNBOOTED_PROBE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    done = subprocess.run([sys.executable, "-m", "launcher", "--nproc", "2", str(probe)],
                          capture_output=True, text=True, env=env, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line.split("UNBOOTED ", 1)[1] for line in done.stdout.splitlines() if "UNBOOTED " in line]
    assert len(lines) == 2, done.stdout[-3000:]
    for line in lines:
        code, seconds, message = line.split(" ", 2)
        assert code == "207004" and float(seconds) < 5, line
        assert "not part of this job" in message and "cards [0, 1]" in message, line
