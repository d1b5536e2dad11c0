"""HCCL's ``[hccl]`` section of the hardware config (``configs/*.toml``): its keys, defaults and CANN's ranges,
registered with the runtime's config reader (``rt/config.py``) when hccl is imported. The environment
(``HCCL_EXEC_TIMEOUT``, ``HCCL_CONNECT_TIMEOUT``) overrides them per process: ``hccl/comm.py``."""

from __future__ import annotations

from rt.args import INT64_MAX
from rt.config import Key, register_section

EXEC_TIMEOUT_MAX = 2147483647      # CANN: HCCL_EXEC_TIMEOUT 0..2147483647 s in the host modes (0 = never)
CONNECT_TIMEOUT_RANGE = (1, 7200)  # CANN documents [120, 7200] s; shorter waits are kept for tests

register_section("hccl", {
    "exec_timeout": Key((int, float), 1836.0, 0, EXEC_TIMEOUT_MAX, " seconds; 0 = never"),
    "connect_timeout": Key((int, float), 120.0, *CONNECT_TIMEOUT_RANGE, " seconds"),
    "buffsize_mb": Key(int, 200, 1, 1 << 16, " MB"),
    "ring_threshold_bytes": Key(int, 0, 0, INT64_MAX, "; 0 = always mesh"),   # one node: mesh up to this size,
})                                                                              # ring above
