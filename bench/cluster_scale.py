"""Large worlds on a multi-node Ray cluster simulated on this machine (issue #25): K raylets
(``ray.cluster_utils.Cluster``, each offering P NPUs, all on 127.0.0.1), then
``launch --address <cluster> --nnodes K --nproc P bench/peers/hccl_scale.py`` — a world of K x P ranks placed on
K Ray nodes as on a real cluster, each rank checking its first all_reduce, timing 1 KiB all_reduces and passing
a barrier.

    python bench/cluster_scale.py --nodes 4 --nproc 16            # 64 ranks on 4 Ray nodes
    python bench/cluster_scale.py --nodes 8 --nproc 32 --iters 10

Reported: the cluster's start, launch → exit, rank 0's result line, the machine's peak used memory above the
idle baseline (what the raylets, cards and ranks add), and how many of each process kind were alive at the peak.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from scale import PeakMemory  # bench/ is not a package: found through sys.path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4, help="Ray nodes (raylets) of the simulated cluster")
    p.add_argument("--nproc", type=int, default=16, help="NPUs (cards, ranks) per Ray node")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--timeout", type=float, default=1200)
    ns = p.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(16))
    from ray.cluster_utils import Cluster

    from rt.host import reaper
    from rt.ray import session
    temp_dir = tempfile.mkdtemp(prefix="rc", dir="/tmp")
    token = reaper.new_tag()
    reaper.tag(token)
    reaper.path(temp_dir, token)
    os.environ["RAY_TMPDIR"] = temp_dir
    with PeakMemory() as mem:
        t0 = time.time()
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 2, "resources": {"NPU": ns.nproc}, "node_ip_address": "127.0.0.1",
            "include_dashboard": False})
        try:
            for _ in range(ns.nodes - 1):
                cluster.add_node(num_cpus=2, resources={"NPU": ns.nproc}, node_ip_address="127.0.0.1")
            cluster.wait_for_nodes()
            for node in cluster.list_all_nodes():
                reaper.processes(token, session._session_processes(node))
            t1 = time.time()
            cfg = os.path.join(temp_dir, "cards.toml")
            with open(cfg, "w") as f:
                f.write(f"[node]\ncards = {ns.nproc}\n")
            cmd = [sys.executable, "-m", "launcher", "--address", cluster.address, "--nnodes", str(ns.nodes),
                   "--nproc", str(ns.nproc), "--config", cfg, "--timeout", str(ns.timeout - 60),
                   os.path.join(ROOT, "bench", "peers", "hccl_scale.py"), "--iters", str(ns.iters)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=ns.timeout, cwd=ROOT, check=False)
            t2 = time.time()
        finally:
            cluster.shutdown()
            reaper.sweep(token)
    m = re.search(r"SCALE_RESULT (\{.*\})", done.stdout)
    row = {"ray_nodes": ns.nodes, "nproc": ns.nproc, "world": ns.nodes * ns.nproc, "exit": done.returncode,
           "cluster_start_s": t1 - t0, "launch_s": t2 - t1, "peak_mem_gib": mem.peak / 2**30,
           **(json.loads(m.group(1)) if m else {})}
    print(json.dumps(row))
    if done.returncode != 0:
        print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)


if __name__ == "__main__":
    main()
