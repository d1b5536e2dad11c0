"""torch_npu's error-code suffix (``torch_npu.utils._error_code``): what its Python checks append to a message.

torch_npu ends its Python-side error texts with a line such as
``[ERROR] 2026-12-02-01:15:48 (PID:1234, Device:0, RankID:-1) ERR00003 PTA invalid value``; scripts and tests
match on the message before it, and log scrapers on the ``ERRxxyyy`` tag. ``TORCH_NPU_COMPACT_ERROR_OUTPUT=1``
drops the suffix, as it does in torch_npu.
"""

from __future__ import annotations

import os
import time
from enum import Enum


class _SubModuleID(Enum):
    PTA = 0
    OPS = 1
    DIST = 2
    GRAPH = 3
    PROF = 4


class ErrCode(Enum):
    """torch_npu's error classes: (number, text) as its ``ErrCode``."""
    SUCCESS = (0, "success")
    PARAM = (1, "invalid parameter")
    TYPE = (2, "invalid type")
    VALUE = (3, "invalid value")
    PTR = (4, "invalid pointer")
    INTERNAL = (5, "internal error")
    MEMORY = (6, "memory error")
    NOT_SUPPORT = (7, "feature not supported")
    NOT_FOUND = (8, "resource not found")
    UNAVAIL = (9, "resource unavailable")
    SYSCALL = (10, "system call failed")
    TIMEOUT = (11, "timeout error")
    PERMISSION = (12, "permission error")
    ACL = (100, "call acl api failed")
    HCCL = (200, "call hccl api failed")

    @property
    def code(self) -> int:
        return self.value[0]

    @property
    def msg(self) -> str:
        return self.value[1]


def _device() -> int:
    from .distributed import bootstrap
    try:
        return bootstrap.current_device()
    except Exception:  # noqa: BLE001 - a message suffix never raises
        return -1


def _rank() -> int:
    try:
        import torch.distributed as dist
        return dist.get_rank() if dist.is_initialized() else -1
    except Exception:  # noqa: BLE001
        return -1


def _format(sub: _SubModuleID, err: ErrCode) -> str:
    if os.environ.get("TORCH_NPU_COMPACT_ERROR_OUTPUT", "0") not in ("", "0"):
        return ""
    stamp = time.strftime("%Y-%m-%d-%H:%M:%S", time.localtime())
    return (f"\n[ERROR] {stamp} (PID:{os.getpid()}, Device:{_device()}, RankID:{_rank()}) "
            f"ERR{sub.value:02d}{err.code:03d} {sub.name} {err.msg}")


def pta_error(err: ErrCode) -> str:
    return _format(_SubModuleID.PTA, err)


def ops_error(err: ErrCode) -> str:
    return _format(_SubModuleID.OPS, err)
