"""Two simulated nodes (ray.cluster_utils.Cluster, 4 NPUs each): launcher placement across nodes and
every collective through the hierarchical algorithm, checked against numpy inside the ranks."""

import os
import re
import secrets
import subprocess
import sys
import tempfile

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "collectives_check.py")
COLLECTIVES = [f"{name} {tag}" for tag in ("small", "large")      # one hub exchange / hierarchical schedules
               for name in ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "scatter",
                            "all_to_all", "barrier")] + ["dtype-op sweep", "mismatch"]


@pytest.fixture(scope="module")
def two_nodes():
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    if os.environ["RAY_AUTH_MODE"] == "token":
        os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(16))
    from ray.cluster_utils import Cluster

    from rt.host import reaper
    from rt.ray import session
    # Ray's files in a directory of ours, its processes (also the agents that outlive a raylet for a minute)
    # ended by pid at teardown, or by the reaper if this process dies first.
    temp_dir = tempfile.mkdtemp(prefix="rc", dir="/tmp")
    token = reaper.new_tag()
    reaper.tag(token)
    reaper.path(temp_dir, token)
    old_tmp = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp_dir              # Ray keeps <RAY_TMPDIR>/ray/ray_current_cluster there too
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"NPU": 4}, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=2, resources={"NPU": 4}, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        for node in cluster.list_all_nodes():
            reaper.processes(token, session._session_processes(node))
        yield cluster
    finally:
        cluster.shutdown()
        reaper.sweep(token)
        if old_tmp is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old_tmp


@pytest.mark.timeout(240)
def test_ranks_split_over_two_nodes_and_hierarchical_collectives_match_numpy(two_nodes):
    proc = subprocess.run([sys.executable, "-m", "launcher", "--nnodes", "2", "--nproc", "4",
                           "--address", two_nodes.address, "--timeout", "200", SCRIPT],
                          capture_output=True, text=True, timeout=230,
                          env=dict(os.environ, HCCL_EXEC_TIMEOUT="60"))   # a hang in the mismatch case fails fast
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    placed = {int(m[1]): (int(m[2]), int(m[3]), int(m[4]))
              for m in re.finditer(r"rank (\d+) node (\d+) card (\d+) algo_nodes (\d+)", out)}
    assert sorted(placed) == list(range(8))
    for rank, (node, card, nodes) in placed.items():
        assert (node, card) == (rank // 4, rank % 4), (rank, node, card)
        assert nodes == 2                     # the communicator spans both nodes: hierarchical schedules
    for rank in range(8):
        for name in COLLECTIVES:
            assert f"rank {rank} OK {name}" in out, (rank, name, out[-2000:])
