"""Rank 2 passes a different count to the same all_reduce."""
import rt
from common import all_reduce, setup

comm, buf = setup()
all_reduce(comm, buf, 512 if comm.rank == 2 else 1024)     # MISMATCH_LINE
rt.synchronize_stream(None)
