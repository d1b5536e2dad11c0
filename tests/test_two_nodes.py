"""Two simulated nodes (ray.cluster_utils.Cluster, 4 NPUs each): launcher placement across nodes and
every collective through the hierarchical algorithm, checked against numpy inside the ranks."""

import os
import secrets
import subprocess
import sys
import tempfile

import pytest



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


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ranks_split_over_two_nodes_and_hierarchical_collectives_match_numpy(two_nodes, collectives_check):
    proc = subprocess.run([sys.executable, "-m", "launcher", "--nnodes", "2", "--nproc", "4",
                           "--address", two_nodes.address, "--timeout", "200", collectives_check.script],
                          capture_output=True, text=True, timeout=230,
                          env=dict(os.environ, HCCL_EXEC_TIMEOUT="60"))   # a hang in the mismatch case fails fast
    collectives_check.assert_ran(proc)
