"""Start-up probe for ``launch --nproc 8 bench/peers/hccl_first.py``: rank 0 prints
``FIRST_COLLECTIVE <unix time>`` as soon as its first 1 KiB fp32 all_reduce has completed. With
``NPUSIM_STARTUP_TRACE=<dir>`` (``bench/startup_trace.py``) every rank also writes, to ``<dir>/rank<r>``, the unix
times it was started, had imported rt and hccl, had its communicator and had its first all_reduce done."""

from __future__ import annotations

import os
import time

_TRACE = os.environ.get("NPUSIM_STARTUP_TRACE")
_times = [("imported", 0.0)]

import numpy as np

import hccl
import rt

_times[0] = ("imported", time.time())
comm = hccl.init()
_times.append(("comm_init", time.time()))
a = np.ones(256, np.float32)
buf = rt.malloc(a.nbytes)
rt.memcpy(buf, a.nbytes, a, a.nbytes, rt.ACL_MEMCPY_HOST_TO_DEVICE)
hccl.all_reduce(buf, buf, 256, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm)
rt.synchronize_stream(None)
_times.append(("first_all_reduce", time.time()))
if comm.rank == 0:
    print(f"FIRST_COLLECTIVE {_times[-1][1]:.6f}", flush=True)
if _TRACE:
    import psutil
    _times.insert(0, ("started", psutil.Process().create_time()))
    with open(os.path.join(_TRACE, f"rank{comm.rank}"), "w", encoding="utf-8") as f:
        f.writelines(f"{comm.rank} {what} {when:.6f}\n" for what, when in _times)
