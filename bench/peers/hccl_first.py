"""Start-up probe for ``launch --nproc 8 bench/peers/hccl_first.py``: rank 0 prints
``FIRST_COLLECTIVE <unix time>`` as soon as its first 1 KiB fp32 all_reduce has completed."""

from __future__ import annotations

import numpy as np

import hccl
import rt

comm = hccl.init()
a = np.ones(256, np.float32)
buf = rt.malloc(a.nbytes)
rt.memcpy(buf, a.nbytes, a, a.nbytes, rt.ACL_MEMCPY_HOST_TO_DEVICE)
hccl.all_reduce(buf, buf, 256, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm)
rt.synchronize_stream(None)
if comm.rank == 0:
    import time
    print(f"FIRST_COLLECTIVE {time.time():.6f}", flush=True)
