"""hccl-test: the oracle against a direct numpy simulation of each collective, the size/busbw rules,
and one real end-to-end run of the command (in a subprocess, so this test process never imports Ray).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hccl import perf as ht
from launcher.tools import hccl_test
from hccl.types import hccl_np_dtype as np_dtype

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def simulate(collective, inputs, lay, op, root):
    """Each rank's recv buffer computed straight from the inputs, the textbook way (None: undefined)."""
    n, per = len(inputs), lay["count"]
    ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    if collective in ("all_reduce", "reduce", "reduce_scatter"):
        total = inputs[0].copy()
        for x in inputs[1:]:
            total = ufunc(total, x)
        if collective == "all_reduce":
            return [total] * n
        if collective == "reduce":
            return [total if r == root else None for r in range(n)]
        return [total[r * per:(r + 1) * per] for r in range(n)]
    if collective == "broadcast":
        return [inputs[root]] * n
    if collective == "all_gather":
        return [np.concatenate(inputs)] * n
    if collective == "scatter":
        return [inputs[root][r * per:(r + 1) * per] for r in range(n)]
    if collective == "all_to_all":
        return [np.concatenate([inputs[j][r * per:(r + 1) * per] for j in range(n)]) for r in range(n)]
    if collective == "send_recv":
        return [inputs[(r - 1) % n] for r in range(n)]
    raise AssertionError(collective)


@pytest.mark.parametrize("collective", [c for c in ht.COLLECTIVES if c != "barrier"])
@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize("op,dtype", [("sum", "fp32"), ("prod", "int8"), ("max", "bf16"), ("min", "uint16")])
def test_oracle_matches_direct_simulation(collective, n, op, dtype):
    dt = np_dtype(dtype)
    lay = ht.layout(collective, 1000, n, dt.itemsize)
    root = n - 1
    inputs = [ht.cast(ht.rank_input(collective, r, lay, op), dt) for r in range(n)]
    want = simulate(collective, inputs, lay, op, root)
    for r in range(n):
        got = ht.expected_output(collective, r, n, lay, op, root)
        if want[r] is None:
            assert got is None
        else:
            np.testing.assert_array_equal(ht.cast(got, dt), want[r])
            assert not np.any(ht.cast(got, dt) == 0)   # 0 is the recv sentinel: never a valid result


def test_layout_rounds_block_collectives_to_ranks():
    lay = ht.layout("all_gather", 1000, 3, 4)          # 250 fp32 → 83 per rank
    assert lay == {"count": 83, "send": 83, "recv": 249, "size": 996, "elements": 249}
    assert ht.layout("all_reduce", 1024, 8, 4)["count"] == 256
    assert ht.layout("reduce_scatter", 1024, 8, 4) == {"count": 32, "send": 256, "recv": 32, "size": 1024,
                                                       "elements": 256}


def test_busbw_factors_and_sizes():
    assert ht.busbw_factor("all_reduce", 8) == pytest.approx(1.75)
    for c in ("all_gather", "reduce_scatter", "all_to_all"):
        assert ht.busbw_factor(c, 8) == pytest.approx(0.875)
    assert ht.busbw_factor("broadcast", 8) == ht.busbw_factor("reduce", 8) == 1.0
    assert [ht.parse_size(s) for s in ("1K", "4M", "1G", "512", "64MiB")] == [1024, 4 << 20, 1 << 30, 512, 64 << 20]
    assert ht.sweep(1024, 64 << 20, 4, 0)[-1] == 64 << 20 and len(ht.sweep(1024, 64 << 20, 4, 0)) == 9
    assert ht.sweep(0, 3, 0, 1) == [0, 1, 2, 3]


def test_bad_arguments_exit_2(capsys):
    assert hccl_test.main(["all_reduce", "-b", "4K", "-e", "1K"]) == 2
    assert hccl_test.main(["broadcast", "-p", "2", "-r", "5"]) == 2
    assert hccl_test.main(["all_reduce", "-d", "complex64"]) == 2
    assert "root must be in [0, 2)" in capsys.readouterr().err


def run_cli(*args):
    env = dict(os.environ, PYTHONPATH=ROOT_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "launcher.tools.hccl_test", *args], cwd=ROOT_DIR, env=env, capture_output=True,
                          text=True, timeout=110)


def test_end_to_end_table_and_json(tmp_path):
    out_json = tmp_path / "rows.json"
    proc = run_cli("all_reduce", "-p", "2", "-b", "1K", "-e", "4K", "-f", "2", "-n", "2", "-w", "1", "-c", "1",
                   "-F", str(out_json))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# nThread 1 nGpus 1 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 1 "
                               "iters: 2 agg iters: 1 validation: 1")
    assert sum(1 for ln in lines if ln.startswith("#  Rank ")) == 2
    header = next(ln for ln in lines if "redop" in ln).split()
    assert header[1:6] == ["size", "count", "type", "redop", "root"]
    assert header[6:] == ["time", "algbw", "busbw", "#wrong"] * 2
    rows = [ln.split() for ln in lines if ln and not ln.startswith("#")]
    assert [(int(r[0]), int(r[1]), r[2], r[3], r[4]) for r in rows] == [
        (1024, 256, "float", "sum", "-1"), (2048, 512, "float", "sum", "-1"), (4096, 1024, "float", "sum", "-1")]
    for r in rows:
        assert r[8] == "0" and r[12] == "0"                                   # #wrong, both groups
        assert float(r[7]) == pytest.approx(float(r[6]) * 1.0, rel=0.02, abs=2e-3)   # busbw = algbw × 2(2-1)/2
    assert "# Out of bounds values : 0 OK" in lines
    assert any(ln.startswith("# Avg bus bandwidth") for ln in lines)

    doc = json.loads(out_json.read_text())
    assert doc["collective"] == "all_reduce" and doc["nranks"] == 2 and doc["wrong_total"] == 0
    assert [row["size"] for row in doc["rows"]] == [1024, 2048, 4096]
    g = doc["rows"][0]["out_of_place"]
    assert g["wrong"] == 0 and g["time_us"] > 0
    assert g["algbw"] == pytest.approx(1024 / (g["time_us"] * 1e-6) / 1e9)


def test_end_to_end_json_stdout_parses():
    proc = run_cli("all_gather", "-p", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "-c", "1", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    row = doc["rows"][0]
    assert (row["size"], row["count"], row["redop"], row["root"]) == (1024, 256, "none", -1)
    assert row["out_of_place"]["wrong"] == 0 and row["in_place"]["wrong"] == 0
    assert doc["busbw_factor"] == pytest.approx(0.5)
