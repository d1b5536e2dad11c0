"""Rank 1 skips the second all_reduce (and then idles): the others wait for it until HCCL_EXEC_TIMEOUT."""
import time

import rt
from common import all_reduce, setup

comm, buf = setup()
all_reduce(comm, buf)
rt.synchronize_stream(None)
if comm.rank != 1:
    all_reduce(comm, buf)                     # SKIPPED_LINE
    rt.synchronize_stream(None)
else:
    time.sleep(60)
