"""Group names, DeviceMesh/DTensor, tensor parallel, functional collectives, ProcessGroupHCCL.Options and
torch.compile of DDP over "hccl" on 2 ranks (scripts/mesh_and_compile.py, checked there against numpy or
single-process torch)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
pytestmark = pytest.mark.timeout(280)


def _env():
    return {k: v for k, v in os.environ.items()
            if k not in ("NPUSIM_BACKEND", "ASCEND_RT_VISIBLE_DEVICES", "RAY_ADDRESS", "MASTER_PORT", "MASTER_ADDR",
                         "WORLD_SIZE", "RANK", "LOCAL_RANK", "NPUSIM_CARD_DIR")}


def test_hccl_options_class_is_torch_npus():
    import torch_npu
    opts = torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()
    assert opts.backend == "hccl" and opts.is_high_priority_stream is False and opts.hccl_config == {}
    assert isinstance(opts, torch._C._distributed_c10d.Backend.Options)
    from torch_npu.distributed.options import checked
    opts.hccl_config = {"hccl_buffer_size": "big"}
    with pytest.raises(RuntimeError, match="Value type of hccl_buffer_size should be int."):
        checked(opts)
    with pytest.raises(TypeError, match="pg_options for the hccl backend"):
        checked({"hccl_buffer_size": 1})


def test_group_names_mesh_tensor_parallel_funcol_and_compiled_ddp_match_the_oracles():
    done = subprocess.run([sys.executable, "-m", "launcher", "--nproc", "2", str(SCRIPTS / "mesh_and_compile.py")],
                          check=False, capture_output=True, text=True, env=_env(), timeout=270, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for rank in range(2):
        assert f"[rank{rank}]:MESH OK" in done.stdout, done.stdout[-3000:]
