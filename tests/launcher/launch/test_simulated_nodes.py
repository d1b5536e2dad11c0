"""`launch --nnodes K` on the embedded session: K simulated servers on this machine (issue #25 items 1, 2) — each
its own node index, cards, sockets and rank-table server; every collective across them takes the cross-node path
(hierarchical schedules, the hub), checked against numpy inside the ranks by the script the two-Ray-node test
runs (tests/test_two_nodes.py runs the same on a real two-raylet cluster)."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def launch(*argv, timeout=230, **env):
    clean = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "NPUSIM_BACKEND", "NPUSIM_CARD_DIR",
                                                                "ASCEND_RT_VISIBLE_DEVICES", "NPUSIM_CARDS_PER_HOST")}
    return subprocess.run([sys.executable, "-m", "launcher", *map(str, argv)], check=False, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=dict(clean, **env))


@pytest.mark.parametrize("per_host", ["1", "4"], ids=["a-worker-per-card", "a-card-host-per-node"])
def test_two_simulated_nodes_run_every_collective_across_nodes(per_host, collectives_check):
    """Also with each node's cards in one Ray worker (a CardHost: what launch gives by default)."""
    proc = launch("--nnodes", 2, "--nproc", 4, "--timeout", 200, collectives_check.script, HCCL_EXEC_TIMEOUT="60",
                  NPUSIM_CARDS_PER_HOST=per_host)
    collectives_check.assert_ran(proc)


def test_each_simulated_node_is_a_server_of_the_rank_table_with_its_own_cards():
    with tempfile.TemporaryDirectory() as d:
        prog = Path(d) / "where.py"
        prog.write_text(textwrap.dedent("""
            import json, os, rt
            rt.init()
            rt.set_device(int(os.environ["DEVICE_ID"]))
            with open(os.environ["RANK_TABLE_FILE"]) as f:
                table = json.load(f)
            print("WHERE", json.dumps({"rank": int(os.environ["RANK"]), "node": int(os.environ["NPUSIM_NODE"]),
                                       "group_rank": int(os.environ["GROUP_RANK"]),
                                       "card_dir": os.environ["NPUSIM_CARD_DIR"],
                                       "servers": [s["server_id"] for s in table["server_list"]],
                                       "server_count": table["server_count"]}), flush=True)
        """))
        proc = launch("--nnodes", 3, "--nproc", 2, prog, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = [json.loads(line.split("WHERE ", 1)[1]) for line in proc.stdout.splitlines() if "WHERE " in line]
    assert sorted(s["rank"] for s in seen) == list(range(6))
    for s in seen:
        assert s["node"] == s["group_rank"] == s["rank"] // 2
        assert int(s["server_count"]) == 3 and len(set(s["servers"])) == 3      # three servers, three names
    assert "launch: error" not in proc.stderr


def test_a_card_host_per_node_is_one_process_holding_its_cards_each_on_its_own_socket():
    """NPUSIM_CARDS_PER_HOST=4: the 4 cards of a node answer on 4 sockets from one process (the host), and
    the two nodes' hosts are two processes."""
    with tempfile.TemporaryDirectory() as d:
        prog = Path(d) / "pid.py"
        prog.write_text(textwrap.dedent("""
            import os, rt
            rt.init()
            rt.set_device(int(os.environ["DEVICE_ID"]))
            import rt.host.runtime as runtime
            ctx = runtime.RUNTIME.current
            print("CARDPID", os.environ["RANK"], os.environ["NPUSIM_NODE"], ctx.client.info["pid"], flush=True)
        """))
        proc = launch("--nnodes", 2, "--nproc", 4, prog, timeout=120, NPUSIM_CARDS_PER_HOST="4")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    pids = {}
    for line in proc.stdout.splitlines():
        if "CARDPID " in line:
            _rank, node, pid = line.split("CARDPID ", 1)[1].split()
            pids.setdefault(int(node), set()).add(int(pid))
    assert sorted(pids) == [0, 1] and all(len(p) == 1 for p in pids.values()), pids
    assert pids[0] != pids[1]
