"""Rank 2's stream is busy with a long kernel when the others enter the all_reduce."""
import rt
from common import all_reduce, setup

comm, buf = setup()
if comm.rank == 2:
    rt.sleep_kernel(60)                        # KERNEL_LINE
all_reduce(comm, buf)                          # ALLREDUCE_LINE
rt.synchronize_stream(None)                    # SYNC_LINE
