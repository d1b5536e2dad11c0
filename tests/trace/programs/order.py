"""Rank 1 calls broadcast then all_reduce; the others all_reduce then broadcast."""
import hccl
import rt
from common import all_reduce, setup

comm, buf = setup()


def bcast():
    hccl.broadcast(buf, 1024, hccl.HCCL_DATA_TYPE_FP32, 0, comm)   # BCAST_LINE


if comm.rank == 1:
    bcast()
    all_reduce(comm, buf)
else:
    all_reduce(comm, buf)
    bcast()
rt.synchronize_stream(None)
