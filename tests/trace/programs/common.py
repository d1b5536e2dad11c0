"""Shared set-up of the broken programs: a world communicator and a 1024-element fp32 buffer per rank."""
import numpy as np

import hccl
import rt


def setup(count=1024):
    comm = hccl.init()
    buf = rt.malloc(count * 4)
    x = np.full(count, comm.rank + 1, np.float32)
    rt.memcpy(buf, x.nbytes, x, x.nbytes, rt.ACL_MEMCPY_HOST_TO_DEVICE)
    return comm, buf


def all_reduce(comm, buf, count=1024):
    hccl.all_reduce(buf, buf, count, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm)
