"""Rank 3 is killed (SIGKILL: no chance to write anything) before the second all_reduce."""
import os
import signal
import time

import rt
from common import all_reduce, setup

comm, buf = setup()
all_reduce(comm, buf)
rt.synchronize_stream(None)
if comm.rank == 3:
    time.sleep(1)                               # the others are inside all_reduce #2 by now
    os.kill(os.getpid(), signal.SIGKILL)
all_reduce(comm, buf)                          # SECOND_LINE
rt.synchronize_stream(None)
