"""init_process_group(timeout=...) is honoured: rank 1 is late (alive, not gone), rank 0's collective fails after
the group's timeout, not HCCL_EXEC_TIMEOUT's 30 minutes.

    launch --nproc 2 slow_peer.py SECONDS
"""
import datetime
import sys
import time

import torch
import torch.distributed as dist

import torch_npu  # noqa: F401

timeout = float(sys.argv[1])
dist.init_process_group("hccl", timeout=datetime.timedelta(seconds=timeout))
rank = dist.get_rank()
torch.npu.set_device(rank)
if rank == 1:
    time.sleep(timeout * 6)
t0 = time.monotonic()
try:
    dist.all_reduce(torch.ones(3).npu())
finally:
    print(f"rank {rank}: all_reduce returned after {time.monotonic() - t0:.1f} s", flush=True)
