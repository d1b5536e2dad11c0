"""torch_npu's distributed fault-mode test, as Ascend writes it: after one all_reduce, rank 1 exits and rank 0
calls all_reduce again. On real NPUs rank 0 waits for HCCL_EXEC_TIMEOUT (30 min) and fails with EI0002; on
npusim it fails at once, naming rank 1.

    launch --nproc 2 rank_leaves.py [leaver]
"""
import os
import sys

import torch
import torch.distributed as dist

import torch_npu  # noqa: F401


def hccl_timeout(leaver):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = os.environ.get("FAULT_TEST_PORT", "29500")
    os.environ["HCCL_WHITELIST_DISABLE"] = "1"
    dist.init_process_group("hccl")
    rank = dist.get_rank()
    torch.npu.set_device(rank)
    tensor = torch.randn(10, 10, dtype=torch.float16).npu()
    zeros = torch.zeros(10, 10, dtype=torch.float16).npu()
    out = zeros if rank > 0 else tensor
    dist.all_reduce(out)
    if rank == leaver:
        exit()
    dist.all_reduce(out)


hccl_timeout(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
