"""ProcessGroupHCCL's exact behaviour on npusim: argument forms and torch_npu's error texts (in-process, no cards),
and on 3 ranks under `launch` the reductions, uneven forms, own-rank point-to-point and argument errors of
scripts/pg_semantics.py, checked there against gloo or plain torch."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
pytestmark = pytest.mark.timeout(170)


def _env(**extra):
    e = {k: v for k, v in os.environ.items()
         if k not in ("NPUSIM_BACKEND", "ASCEND_RT_VISIBLE_DEVICES", "RAY_ADDRESS", "MASTER_PORT", "MASTER_ADDR",
                      "WORLD_SIZE", "RANK", "LOCAL_RANK", "NPUSIM_CARD_DIR")}
    e.update(extra)
    return e


def _raises(fn, exc, *words):
    with pytest.raises(exc) as e:
        fn()
    assert type(e.value) is exc and all(w in str(e.value) for w in words), str(e.value)
    return str(e.value)


@pytest.fixture
def checks(monkeypatch):
    monkeypatch.delenv("TORCH_NPU_COMPACT_ERROR_OUTPUT", raising=False)
    monkeypatch.setenv("RANK", "3")
    from torch_npu.distributed import checks
    return checks


def npu(t):
    """``t`` as the rank's npu tensor: on the ``npu`` device where it is one, else the CPU tensor itself."""
    from torch_npu.distributed import checks
    return t.to("npu") if checks.npu_is_real() else t


def test_checks_use_torch_npus_types_and_texts(checks):
    text = _raises(lambda: checks.single(npu(torch.rand(2, 3)).T), RuntimeError, "Tensors must be contiguous\n[ERROR] ")
    assert "RankID:3) ERR02002 DIST invalid type" in text
    checks.single(npu(torch.rand(2, 3, 4, 5)).contiguous(memory_format=torch.channels_last))
    _raises(lambda: checks.one_per_process([]), RuntimeError, "Tensor list must be nonempty", "ERR02001")
    _raises(lambda: checks.one_per_process([npu(torch.ones(1)), npu(torch.ones(1))]), RuntimeError,
            "Tensor list mustn't be larger than the number of available NPUs", "ERR02003")
    _raises(lambda: checks.same_device([npu(torch.ones(1)), npu(torch.ones(1, dtype=torch.int32))]), RuntimeError,
            "Tensors must have identical type")
    _raises(lambda: checks.same_device([npu(torch.ones(4))[::2]]), RuntimeError,
            "Tensors must be non-overlapping and dense")
    checks.same_device([npu(torch.ones(3, 4)).T])                # dense in another order is fine for lists
    _raises(lambda: checks.single(torch.ones(2, device="meta")), RuntimeError, "Tensors must be NPU and dense")
    _raises(lambda: checks.dtype(torch.ones(1, dtype=torch.complex64)), RuntimeError,
            "Unsupported data type for HCCL process group", "ERR02007 DIST feature not supported")
    _raises(lambda: checks.reducible(torch.ones(1, dtype=torch.float64), "allreduce"), RuntimeError,
            "HCCL allreduce: Unsupported data type at::kDouble")
    _raises(lambda: checks.reduce_op(torch.distributed.ReduceOp.BOR, torch.ones(1)), RuntimeError,
            "Cannot use ReduceOp.BOR with HCCL")
    _raises(lambda: checks.reduce_op(torch.distributed._make_nccl_premul_sum(2.0), torch.ones(1, dtype=torch.int64)),
            RuntimeError, "PreMulSum Data type must be half, float, bfloat16 or double")
    for op in (torch.distributed.ReduceOp.AVG, torch.distributed._make_nccl_premul_sum(2.0)):
        checks.reduce_op(op, torch.ones(1))


def test_reduce_scatter_on_two_devices_is_refused(checks):
    # npu:r and npu:r+1 where npu is a device of its own; cpu and meta stand in for two devices here
    _raises(lambda: checks.reduce_scatter_devices([torch.zeros(4, device="meta")], torch.zeros(4)), RuntimeError,
            "Corresponding input/output tensors to reduce_scatter must all reside on the same device", "ERR02001")
    _raises(lambda: checks.reduce_scatter_devices([], torch.zeros(4)), RuntimeError,
            "Tensor list operands to reduce_scatter must be non-empty")
    checks.reduce_scatter_devices([torch.zeros(4)], torch.zeros(4))


def test_internal_format_with_an_offset_is_refused(checks):
    formats = pytest.importorskip("torch_npu.formats")
    view = formats.npu_format_cast_(npu(torch.zeros(8))[2:], 29)          # FRACTAL_NZ, storage offset 2
    _raises(lambda: checks.single(view), RuntimeError, "For a tensor of internal format, it's storage_offset must be 0")
    checks.single(formats.npu_format_cast_(npu(torch.zeros(8)), 29))
    checks.single(npu(torch.zeros(8))[2:])                                  # base format: any offset


def test_split_and_root_list_checks(checks):
    assert checks.splits(torch.zeros(6, 2), [], 3) == [2, 2, 2]
    assert checks.splits(torch.zeros(6, 2), [1, 0, 5], 3) == [1, 0, 5]
    _raises(lambda: checks.splits(torch.zeros(5), [], 3), RuntimeError, "Tensor's dim 0 does not divide equally")
    _raises(lambda: checks.splits(torch.zeros(5), [5], 3), RuntimeError, "Number of tensor splits not equal")
    _raises(lambda: checks.splits(torch.zeros(5), [1, 1, 1], 3), RuntimeError, "Split sizes doesn't match total dim 0")
    _raises(lambda: checks.splits(torch.zeros(()), [], 3), RuntimeError, "Scalar tensors (0-dim tensors) are not")
    like = npu(torch.zeros(2))
    assert checks.root_list([], like, 2, 1, 0, "gather", "output") == []
    _raises(lambda: checks.root_list([[like]], like, 2, 1, 0, "gather", "output"), ValueError,
            "ProcessGroupHCCL::gather: requires empty output on non-root")
    _raises(lambda: checks.root_list([[like]], like, 2, 0, 0, "gather", "output"), ValueError,
            "Incorrect output list size 1. Output list size should be 2, same as size of the process group.")
    _raises(lambda: checks.root_list([[like, npu(torch.zeros(3))]], like, 2, 0, 0, "scatter", "input"), ValueError,
            "ProcessGroupHCCL::scatter: invalid tensor size at index 1")
    _raises(lambda: checks.root_list([like], like, 2, 0, 5, "scatter", "input"), ValueError, "invalid root rank: 5")


def test_compact_error_output_drops_the_code_line(checks, monkeypatch):
    monkeypatch.setenv("TORCH_NPU_COMPACT_ERROR_OUTPUT", "1")
    assert _raises(lambda: checks.single(npu(torch.rand(2, 3)).T), RuntimeError) == "Tensors must be contiguous"


def test_only_npu_tensors_are_npu_tensors(checks):
    assert checks.is_npu(npu(torch.zeros(2)))
    assert not checks.is_npu(torch.zeros(2)) and not checks.is_npu(torch.zeros(2, device="meta"))
    _raises(lambda: checks.single(torch.zeros(2)), RuntimeError, "Tensors must be NPU and dense")


def test_the_backend_is_registered_for_npu_only():
    import torch.distributed as dist

    import torch_npu  # noqa: F401
    assert dist.Backend.backend_capability["hccl"] == ["npu"]
    assert str(dist.distributed_c10d.BackendConfig("hccl")) == "npu:hccl"


@pytest.mark.parametrize("backend", ["hccl", "cpu:gloo,npu:hccl"])
def test_cpu_tensors_are_refused_or_go_to_gloo(backend):
    """"hccl": every collective and point-to-point call on CPU tensors fails with c10d's text; object collectives
    and barrier still work (on the current npu). "cpu:gloo,npu:hccl": CPU tensors go to gloo, npu ones to hccl."""
    done = subprocess.run([sys.executable, "-m", "launcher", "--nproc", "2", str(SCRIPTS / "cpu_tensors.py"), backend],
                          check=False, capture_output=True, text=True, env=_env(), timeout=150, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for rank in range(2):
        assert f"[rank{rank}]:CPU OK ({backend}) on rank {rank}" in done.stdout, done.stdout[-3000:]


def test_semantics_on_three_ranks_match_the_oracles():
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "launcher", "--nproc", "3", str(SCRIPTS / "pg_semantics.py")],
                          check=False, capture_output=True, text=True, env=_env(), timeout=150, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for rank in range(3):
        assert f"[rank{rank}]:SEMANTICS OK" in done.stdout, done.stdout[-3000:]
    assert time.monotonic() - t0 < 150
