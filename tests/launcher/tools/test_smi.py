"""npu-smi (launcher/tools/smi.py): the cards' live memory and processes, read through a monitoring connection that
changes nothing; a clear message and status 1 when nothing runs; stale card sets ignored and removed."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launcher.tools import smi
from rt.card.card import Card
from rt.ray.session import write_owner
from rt.wire.channel import LocalTransport, socket_path
from rt.wire.server import CardServer

pytestmark = pytest.mark.timeout(120)
MiB = 1 << 20


def _smi(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "launcher.tools.smi", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_no_session_is_one_line_and_status_1(tmp_path):
    r = _smi("info", "--root", str(tmp_path))
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "no running npusim session" in r.stderr and "Traceback" not in r.stderr
    assert smi.main(["info", "--json", "--root", str(tmp_path / "missing")]) == 1


def test_a_stale_card_set_is_ignored_and_removed(tmp_path, capsys):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / "pool-stale"
    stale.mkdir()
    (stale / "npu0_0.sock").write_text("")                        # a card that died without unlinking it
    (stale / "owner.json").write_text(json.dumps({"pid": gone.pid, "start_time": 1, "job": "x"}))
    assert smi.main(["info", "--root", str(tmp_path)]) == 1
    assert not stale.exists()
    assert "no running npusim session" in capsys.readouterr().err


def test_a_served_card_reports_memory_and_processes_and_not_the_monitor(tmp_path, capsys):
    """A card served over its socket (no Ray): npu-smi's numbers are the card's own, the rank's connection is
    listed with what it holds, and the monitoring connection neither shows up nor stays."""
    sockets = tmp_path / "job1"
    card = Card(node=0, index=0, capacity=64 * MiB)
    server = CardServer(card, socket_path(str(sockets), 0, 0))
    write_owner(str(sockets), "job1")
    rank = LocalTransport(card, lambda m, f: None)
    try:
        card.c_hello(rank.conn, 4242, "host")
        card.commands["malloc"](rank.conn, 3 * MiB)
        free, total = card.memory.mem_info()
        assert smi.main(["info", "--json", "--root", str(tmp_path)]) == 0
        doc = json.loads(capsys.readouterr().out)
        (session,) = doc["sessions"]
        assert session["owner_pid"] == os.getpid() and session["job"] == "job1" and session["kind"] == "process"
        (c,) = session["cards"]
        assert (c["npu"], c["name"], c["health"]) == (0, "910B1", "OK")
        assert (c["hbm_used_bytes"], c["hbm_total_bytes"], c["hbm_total_mb"]) == (total - free, total, 64)
        (p,) = c["processes"]
        assert p["pid"] == 4242 and p["memory_bytes"] >= 3 * MiB and p["memory_mb"] == 3 and p["contexts"] == 1
        assert smi.main(["info", "-t", "usages", "-i", "0", "--root", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert "HBM Capacity(MB)               : 64" in out and "Chip ID                        : 0" in out
        assert smi.main(["info", "-i", "5", "--root", str(tmp_path)]) == 1
        assert "NPU 5 does not exist (running NPUs: 0)" in capsys.readouterr().err
        deadline = time.monotonic() + 5
        while len(card.conns) > 1 and time.monotonic() < deadline:   # the monitors' connections closed
            time.sleep(0.01)
        assert list(card.conns) == [rank.conn.id]
        assert card.memory.mem_info() == (free, total)
    finally:
        rank.close()
        server.close()
        card.close()


def test_a_card_without_usage_still_shows_its_memory(tmp_path):
    """Cards booted before npu-smi existed (a long-running cluster) answer ``mem_info`` only."""
    class OldCard(Card):
        c_usage = None

    card = OldCard(node=0, index=2, capacity=64 * MiB)
    server = CardServer(card, socket_path(str(tmp_path / "old"), 0, 2))
    try:
        (session,) = smi.collect(str(tmp_path))["sessions"]
        (c,) = session["cards"]
        assert session["owner_pid"] is None and session["kind"] == "unknown"
        assert (c["npu"], c["health"], c["hbm_total_mb"], c["processes"]) == (2, "OK", 64, None)
        assert "too old to list its processes" in smi.render_info(smi.collect(str(tmp_path)))
    finally:
        server.close()
        card.close()


def hold_memory(sync_dir: str, nbytes: int):
    """A rank: allocate ``nbytes``, report what its card says, hold it until the test says done."""
    import rt
    rt.init()
    rt.set_device(int(os.environ.get("DEVICE_ID", "0")))
    ptr = rt.malloc(nbytes)
    free, total = rt.get_mem_info()
    report = Path(sync_dir, "held.json")
    report.with_suffix(".tmp").write_text(json.dumps({"pid": os.getpid(), "free": free, "total": total}))
    report.with_suffix(".tmp").rename(report)
    deadline = time.monotonic() + 60
    while not Path(sync_dir, "done").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    rt.free(ptr)
    return os.getpid()


def _find(doc, pid):
    return [(s, c, p) for s in doc["sessions"] for c in s["cards"] for p in (c["processes"] or ()) if p["pid"] == pid]


@pytest.mark.npu_timeout(90)
def test_npu_smi_shows_live_hbm_use_of_a_running_rank(npu_spawn, tmp_path, capsys):
    nbytes = 64 * MiB
    box = {}

    def run():
        try:
            box["result"] = npu_spawn(hold_memory, nproc=1, args=(str(tmp_path), nbytes))
        except BaseException as e:  # noqa: BLE001 - reported below
            box["error"] = e

    job = threading.Thread(target=run, daemon=True)
    job.start()
    held = tmp_path / "held.json"
    try:
        deadline = time.monotonic() + 60
        while not held.exists() and job.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held.exists(), f"the rank never reported: {box.get('error')}"
        rank = json.loads(held.read_text())
        r = _smi("info", "--json")
        assert r.returncode == 0, r.stderr
        found = _find(json.loads(r.stdout), rank["pid"])
        assert len(found) == 1, found
        session, card, proc = found[0]
        assert session["owner_pid"] == os.getpid() and session["kind"] == "process"
        assert card["health"] == "OK"
        assert card["hbm_used_bytes"] == rank["total"] - rank["free"]      # what rt.get_mem_info says there
        assert card["hbm_total_bytes"] == rank["total"]
        assert card["hbm_used_mb"] >= 64 and proc["memory_bytes"] >= nbytes and proc["memory_mb"] == 64
        assert all(smi.MONITOR_LABEL not in p["labels"] for p in card["processes"])
        assert smi.main(["info", "--session", session["name"]]) == 0
        table = capsys.readouterr().out
        assert f"| {card['npu']:<6}{card['name']}" in table and f"| {rank['pid']:<14}|" in table
        assert f"{card['hbm_used_mb']:<4} / {card['hbm_total_mb']}" in table
        assert smi.main(["info", "-t", "usages", "-i", str(card["npu"]), "--session", session["name"]]) == 0
        assert f"HBM Usage(MB)                  : {card['hbm_used_mb']}" in capsys.readouterr().out
    finally:
        (tmp_path / "done").write_text("")
        job.join(60)
    assert not job.is_alive() and box.get("result") == [rank["pid"]], box
    assert _find(smi.collect(), rank["pid"]) == []                        # the job ended: its card was reset
