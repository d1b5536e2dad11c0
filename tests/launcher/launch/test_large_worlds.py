"""Many simulated servers (issue #25): 4 simulated nodes x 2 cards under `launch --nnodes 4 --nproc 2` — an
all_reduce across nodes (one round of the node leaders, and the hierarchical schedule) against numpy, the job's
rank table of 4 servers joined with comm_init_cluster_info(_config), a sub-communicator per node and one across
the nodes, and a rank of node 3 killed in a collective: every other rank's error names it."""

import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from hccl import algos

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

RANKS = textwrap.dedent("""
    import json, os
    import numpy as np
    import hccl, rt

    def pattern(count, rank):
        return ((np.arange(count) * 7 + 31 * rank) % 101 - 50).astype(np.float32)

    comm = hccl.init()
    r, n = comm.rank, comm.size
    node = int(os.environ["NPUSIM_NODE"])
    stream = rt.create_stream()
    FP32, SUM, MAX = hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, hccl.HCCL_REDUCE_MAX

    def all_reduce(c, count, op, seed_rank, ranks):
        t = rt.Tensor.from_numpy(pattern(count, seed_rank))
        hccl.all_reduce(t.ptr, t.ptr, count, FP32, op, c, stream)
        rt.synchronize_stream(stream)
        inputs = np.stack([pattern(count, k) for k in ranks])
        expect = inputs.sum(0) if op == SUM else inputs.max(0)
        np.testing.assert_allclose(t.numpy(), expect, rtol=1e-5, atol=1e-3)

    # across the 4 nodes: 1000 floats in one round of the node leaders; 300000 by the hierarchical schedule
    for count, tag in ((1000, "small"), (300_000, "large")):
        all_reduce(comm, count, SUM, r, range(n))
        print(f"rank {r} node {node} OK all_reduce {tag} over {len({m[0] for m in comm.members})} nodes", flush=True)

    # a sub-communicator per node (HcclCreateSubCommConfig): the node's two ranks, sub ranks 0 and 1
    ids = [k for k in range(n) if comm.members[k][0] == node]
    sub = hccl.create_sub_comm(comm, ids, 100 + node, ids.index(r), {"exec_timeout": 60})
    assert (hccl.get_rank_size(sub), hccl.get_rank_id(sub)) == (len(ids), ids.index(r))
    all_reduce(sub, 4096, SUM, r, ids)
    print(f"rank {r} OK sub-communicator of node {node}: ranks {ids}", flush=True)
    # and one across the nodes: the ranks with the same local index (a "column", one rank per node)
    col = [k for k in range(n) if k % 2 == r % 2]
    across = hccl.create_sub_comm(comm, col, 200 + r % 2, col.index(r))
    all_reduce(across, 3000, MAX, r, col)
    print(f"rank {r} OK sub-communicator across nodes: ranks {col}", flush=True)

    # the job's rank table: one server per simulated node
    with open(os.environ["RANK_TABLE_FILE"]) as f:
        table = json.load(f)
    servers = [[d["rank_id"] for d in s["device"]] for s in table["server_list"]]
    table_comm = hccl.comm_init_cluster_info_config(os.environ["RANK_TABLE_FILE"], r, {"deterministic": True})
    all_reduce(table_comm, 2048, MAX, r, range(n))
    print(f"rank {r} OK rank table of {table['server_count']} servers {json.dumps(servers)}", flush=True)
    for c in (sub, across, table_comm, comm):
        hccl.comm_destroy(c)
    # a leader's process led its node's rounds in a thread per communicator (host-led): destroy stops each
    import threading, time
    leads = lambda: [t.name for t in threading.enumerate() if t.name.startswith("hccl-lead-")]
    deadline = time.monotonic() + 5
    while leads() and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"rank {r} lead threads left after destroy: {leads()}", flush=True)
""")

KILLED = textwrap.dedent("""
    import signal
    import numpy as np
    import hccl, rt

    signal.signal(signal.SIGTERM, lambda *a: None)   # launch stops the job when rank 6 dies: say why first
    comm = hccl.init()
    t = rt.Tensor.from_numpy(np.ones(256, np.float32))
    for i in range(3):
        try:
            comm.all_reduce(t)
            rt.synchronize_device()
        except hccl.HcclError as e:
            print(f"rank {comm.rank} FAILED [{e.code}] {e.message}", flush=True)
            raise SystemExit(1)
""")


LATE = textwrap.dedent("""
    import signal, time
    import numpy as np
    import hccl, rt

    signal.signal(signal.SIGTERM, lambda *a: None)
    comm = hccl.init()
    stream = rt.create_stream()
    t = rt.Tensor.from_numpy(np.ones(256, np.float32))
    for i in range(3):
        if i == 1 and comm.rank == 5:
            time.sleep(60)                           # rank 5 (node 2) never calls its 2nd all_reduce in time
        try:
            comm.all_reduce(t, stream=stream)
            rt.synchronize_stream(stream)
        except hccl.HcclError as e:
            print(f"rank {comm.rank} FAILED [{e.code}] {e.message}", flush=True)
            raise SystemExit(1)
""")


def launch(prog: str, *argv, timeout=230, **env):
    clean = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "NPUSIM_BACKEND", "NPUSIM_CARD_DIR",
                                                                "ASCEND_RT_VISIBLE_DEVICES", "NPUSIM_CARDS_PER_HOST",
                                                                "NPUSIM_FAULTS")}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "prog.py"
        path.write_text(prog)
        return subprocess.run([sys.executable, "-m", "launcher", *map(str, argv), path], check=False, capture_output=True,
                              text=True, timeout=timeout, cwd=ROOT, env=dict(clean, **env))


def test_four_simulated_nodes_all_reduce_sub_communicators_and_a_rank_table_of_four_servers():
    assert algos.choose("all_reduce", 8, 300_000 * 4, nodes=4)[0] == "hierarchical"    # what the large one runs
    proc = launch(RANKS, "--nnodes", 4, "--nproc", 2, "--timeout", 200, HCCL_EXEC_TIMEOUT="60")
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    for r in range(8):
        node = r // 2
        assert f"rank {r} node {node} OK all_reduce small over 4 nodes" in out
        assert f"rank {r} node {node} OK all_reduce large over 4 nodes" in out
        assert f"rank {r} OK sub-communicator of node {node}: ranks [{2 * node}, {2 * node + 1}]" in out
        assert f"rank {r} OK sub-communicator across nodes: ranks {list(range(r % 2, 8, 2))}" in out
        assert f'rank {r} OK rank table of 4 servers [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]' in out
        assert f"rank {r} lead threads left after destroy: []" in out


@pytest.mark.parametrize("per_host", ["1", "2"], ids=["a-worker-per-card", "a-card-host-per-node"])
def test_a_rank_killed_on_node_3_is_named_in_every_other_ranks_error(per_host):
    """Rank 6 (node 3) dies of SIGKILL entering its 2nd all_reduce: the ranks waiting for it across nodes fail
    with EI0002 naming rank 6 and node 3 — as soon as its card sees it go, well before HCCL_EXEC_TIMEOUT."""
    proc = launch(KILLED, "--nnodes", 4, "--nproc", 2, "--inject", "kill:rank=6:collective=2", "--timeout", 200,
                  "--grace-period", 60,
                  HCCL_EXEC_TIMEOUT="120", NPUSIM_CARDS_PER_HOST=per_host)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    failed = dict(re.findall(r"rank (\d+) FAILED (.*)", out))
    assert sorted(map(int, failed)) == [0, 1, 2, 3, 4, 5, 7], out[-3000:]
    for rank, text in failed.items():
        assert "rank 6 (node 3)" in text and "EI0002" in text, (rank, text)
        assert "is gone: its process exited" in text, (rank, text)


@pytest.mark.parametrize("killed,node", [(0, 0), (7, 3)], ids=["the-root-leader", "a-non-leader"])
def test_a_killed_root_leader_or_non_leader_is_named_in_every_other_ranks_error(killed, node):
    """The leaders' processes lead the rounds across nodes (hccl/transport/leaders.py): rank 0, whose process is
    the root of that exchange, or rank 7, a rank its node's leader waits for, dies entering its 2nd all_reduce;
    every other rank's error names it."""
    proc = launch(KILLED, "--nnodes", 4, "--nproc", 2, "--inject", f"kill:rank={killed}:collective=2", "--timeout", 200,
                  "--grace-period", 60, HCCL_EXEC_TIMEOUT="120")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    failed = dict(re.findall(r"rank (\d+) FAILED (.*)", out))
    assert sorted(map(int, failed)) == [r for r in range(8) if r != killed], out[-3000:]
    for rank, text in failed.items():
        assert f"rank {killed} (node {node})" in text and "EI0002" in text, (rank, text)
        assert "is gone: its process exited" in text, (rank, text)


def test_a_rank_that_never_calls_is_named_by_its_own_node_to_every_rank():
    """Rank 5 (node 2) does not call its 2nd all_reduce: its node's leader times out waiting for it
    (HCCL_EXEC_TIMEOUT=5) and tells the root, which tells every node: every other rank's error names rank 5."""
    proc = launch(LATE, "--nnodes", 4, "--nproc", 2, "--timeout", 200, "--grace-period", 5, HCCL_EXEC_TIMEOUT="5")
    out = proc.stdout + proc.stderr
    failed = dict(re.findall(r"rank (\d+) FAILED (.*)", out))
    assert sorted(map(int, failed)) == [0, 1, 2, 3, 4, 6, 7], out[-3000:]
    for rank, text in failed.items():
        assert text.startswith("[9] ") and "EI0002 timed out after 5 s (HCCL_EXEC_TIMEOUT) waiting for ranks [5] " \
               "of node 2 to call it; rank 5 (node 2): last completed collective #1" in text, (rank, text)
