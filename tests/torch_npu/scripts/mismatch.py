"""Ranks that disagree on a collective's size or dtype: every rank's error names what each rank called.

    launch --nproc 2 mismatch.py size|dtype|op
"""
import sys

import torch
import torch.distributed as dist

import torch_npu  # noqa: F401

dist.init_process_group("hccl")
rank = dist.get_rank()
torch.npu.set_device(rank)
kind = sys.argv[1]
dtype = torch.float16 if kind == "dtype" and rank else torch.float32
t = torch.ones(4 + rank if kind == "size" else 4, dtype=dtype).npu()
dist.all_reduce(t, op=dist.ReduceOp.MAX if kind == "op" and rank else dist.ReduceOp.SUM)
