"""Small collectives across simulated nodes, node-staged (``hccl/protocol/nodestaged.py``, issue #25): 4 simulated
nodes x 2 cards under `launch --nnodes 4 --nproc 2` — every small collective against numpy with the ranks on the
host path (a node's ranks meet in its control block, its leader's card crosses nodes), then with a leader and a
non-leader forced to the card path (mixed), and a mismatch across nodes named on every rank."""

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

RANKS = textwrap.dedent("""
    import json, os, sys
    r = int(os.environ["RANK"])
    if str(r) in os.environ.get("CARD_PATH_RANKS", "").split(","):
        os.environ["NPUSIM_HCCL_HOST_PATH"] = "0"          # this rank runs every collective on its card
    import numpy as np
    import hccl, rt

    comm = hccl.init()
    n = comm.size
    stream = rt.create_stream()
    F32, I64 = hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_DATA_TYPE_INT64
    C = 37                                                  # elements per block

    def data(k, items):
        return ((np.arange(items) * 7 + 31 * k) % 101 - 50).astype(np.int64)

    def check(name, got, expect):
        rt.synchronize_stream(stream)
        if not np.array_equal(got.numpy(), expect):
            raise SystemExit(f"rank {r}: {name} wrong: {got.numpy()[:6]} vs {expect[:6]}")

    for it in range(3):
        x = rt.Tensor.from_numpy(data(r + it, C * n))
        out = rt.empty(C * n, np.int64)
        allx = np.stack([data(k + it, C * n) for k in range(n)])
        hccl.all_reduce(x.ptr, out.ptr, C * n, I64, hccl.HCCL_REDUCE_SUM, comm, stream)
        check("all_reduce sum", out, allx.sum(0))
        hccl.all_reduce(x.ptr, out.ptr, C * n, I64, hccl.HCCL_REDUCE_MAX, comm, stream)
        check("all_reduce max", out, allx.max(0))
        f = rt.Tensor.from_numpy(np.linspace(-1, 1, C, dtype=np.float32) * (r + 1))
        fo = rt.empty(C, np.float32)
        hccl.all_reduce(f.ptr, fo.ptr, C, F32, hccl.HCCL_REDUCE_SUM, comm, stream)
        rt.synchronize_stream(stream)
        np.testing.assert_allclose(fo.numpy(), np.linspace(-1, 1, C, dtype=np.float32) * sum(range(1, n + 1)),
                                   rtol=1e-5, atol=1e-5)
        b = rt.Tensor.from_numpy(data(r + it, C))
        hccl.broadcast(b.ptr, C, I64, 5, comm, stream)
        check("broadcast", b, data(5 + it, C))
        blk = rt.empty(C, np.int64)
        hccl.reduce_scatter(x.ptr, blk.ptr, C, I64, hccl.HCCL_REDUCE_SUM, comm, stream)
        check("reduce_scatter", blk, allx.sum(0)[r * C: (r + 1) * C])
        hccl.all_gather(blk.ptr, out.ptr, C, I64, comm, stream)
        check("all_gather", out, allx.sum(0))
        hccl.scatter(x.ptr, blk.ptr, C, I64, 6, comm, stream)
        check("scatter", blk, allx[6][r * C: (r + 1) * C])
        hccl.all_to_all(x.ptr, C, I64, out.ptr, C, I64, comm, stream)
        check("all_to_all", out, np.concatenate([allx[k][r * C: (r + 1) * C] for k in range(n)]))
        hccl.barrier(comm, stream)
        rt.synchronize_stream(stream)
    host = comm.host_path()
    print("STATS", json.dumps({"rank": r, "host": host is not None, "done": host.done if host else 0,
                               "handed": host.handed if host else 0}), flush=True)
    print(f"rank {r} OK every small collective", flush=True)

    # a mismatch across nodes: rank 5 passes another count; every rank is told who called what
    count = 9 if r == 5 else 4
    t = rt.Tensor.from_numpy(np.ones(count, np.float32))
    hccl.all_reduce(t.ptr, t.ptr, count, F32, hccl.HCCL_REDUCE_SUM, comm, stream)
    try:
        rt.synchronize_stream(stream)
    except hccl.HcclError as e:
        print(f"rank {r} MISMATCH [{int(e.code)}] {e.message}", flush=True)
    else:
        raise SystemExit(f"rank {r}: the mismatched all_reduce did not fail")
    hccl.comm_destroy(comm)
""")


def launch(prog: str, *argv, timeout=230, **env):
    clean = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "NPUSIM_BACKEND", "NPUSIM_CARD_DIR",
                                                                "ASCEND_RT_VISIBLE_DEVICES", "NPUSIM_CARDS_PER_HOST",
                                                                "NPUSIM_FAULTS", "NPUSIM_HCCL_HOST_PATH")}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "prog.py"
        path.write_text(prog)
        return subprocess.run([sys.executable, "-m", "launcher", *map(str, argv), path], check=False, capture_output=True,
                              text=True, timeout=timeout, cwd=ROOT, env=dict(clean, **env))


@pytest.mark.parametrize("card_ranks", ["", "1,4"], ids=["host-path", "mixed"])
def test_every_small_collective_across_four_nodes_against_numpy_and_a_mismatch_named(card_ranks):
    """"mixed": rank 1 (not a leader) and rank 4 (node 2's leader) run every collective on their cards — so the
    communicator is not host-led and the leaders' cards lead."""
    proc = launch(RANKS, "--nnodes", 4, "--nproc", 2, "--timeout", 200, HCCL_EXEC_TIMEOUT="60",
                  CARD_PATH_RANKS=card_ranks)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    stats = {s["rank"]: s for s in (json.loads(line.split("STATS ", 1)[1]) for line in out.splitlines()
                                    if "STATS " in line)}
    assert sorted(stats) == list(range(8))
    forced = {int(k) for k in card_ranks.split(",") if k}
    for r in range(8):
        assert f"rank {r} OK every small collective" in out
        assert stats[r]["host"] == (r not in forced), stats[r]
    # the non-leaders on the host path finished calls themselves, without their cards (29 calls each)
    assert sum(stats[r]["done"] for r in (3, 5, 7)) > 0, stats
    leaders = (0, 2, 4, 6)
    if not forced:      # host-led (hccl/transport/leaders.py): each leader's process leads its node's rounds
        assert all(stats[r]["done"] > 0 for r in leaders), stats
    else:               # node 2's leader runs on its card, so the leaders' cards lead every node's rounds
        assert all(stats[r]["done"] == 0 for r in leaders), stats
    mismatch = dict(re.findall(r"rank (\d+) MISMATCH (.*)", out))
    assert sorted(map(int, mismatch)) == list(range(8)), out[-3000:]
    for text in mismatch.values():
        assert text.startswith("[1] ") and "ranks called different collectives: ranks 0,1,2,3,4,6,7 called " \
               "all_reduce(count=4, dtype=FP32, op=SUM); rank 5 called all_reduce(count=9" in text, text
