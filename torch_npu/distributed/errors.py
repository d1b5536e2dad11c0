"""What a torch user sees when a collective fails or is called wrongly.

- A collective that failed on the cards: ``torch.distributed.DistBackendError`` carrying npusim's diagnosis — the
  rank, the collective and its sequence number, HCCL's code and name, CANN's error tag (``EI0002`` for a peer
  that never arrived or is gone) — and the values that did not match.
- An argument mistake: ProcessGroupHCCL's own exception and text, ended with torch_npu's error-code line
  (``[ERROR] <time> (PID:.., Device:.., RankID:..) ERR02002 DIST invalid type``; none with
  ``TORCH_NPU_COMPACT_ERROR_OUTPUT=1``), raised in the calling thread before anything is queued.
"""

from __future__ import annotations

import os
import time
import traceback

import torch.distributed as dist

from hccl.errors import HcclError
from hccl.types import HcclResult
from rt.errors import NpuError

# torch_npu's ErrCode numbers and texts (the DIST sub-module is 02).
PARAM, TYPE, VALUE, NOT_SUPPORT, NOT_FOUND = 1, 2, 3, 7, 8
_TEXT = {PARAM: "invalid parameter", TYPE: "invalid type", VALUE: "invalid value",
         NOT_SUPPORT: "feature not supported", NOT_FOUND: "resource not found"}


def dist_error(code: int) -> str:
    """torch_npu's ``DIST_ERROR(code)`` suffix."""
    if os.environ.get("TORCH_NPU_COMPACT_ERROR_OUTPUT", "0") not in ("", "0"):
        return ""
    from . import bootstrap
    try:
        device = bootstrap.current_device()
    except Exception:  # noqa: BLE001 - a message suffix never raises
        device = -1
    rank = os.environ.get("RANK", "")
    rank = int(rank) if rank.isdigit() else -1                   # torch_npu reads RANK, -1 without it
    stamp = time.strftime("%Y-%m-%d-%H:%M:%S", time.localtime())
    return (f"\n[ERROR] {stamp} (PID:{os.getpid()}, Device:{device}, RankID:{rank}) "
            f"ERR02{code:03d} DIST {_TEXT[code]}")


def fail(message: str, code: int, kind: type = RuntimeError):
    """Raise ProcessGroupHCCL's ``TORCH_CHECK`` failure (a ``RuntimeError``) with torch_npu's suffix."""
    raise kind(message + dist_error(code))


def backend_error(work, exc: BaseException) -> BaseException:
    """The exception ``work.wait()`` raises for ``exc`` (raised while the collective ran on the card)."""
    where = f"[Rank {work.pg.rank()}] hccl {work.op} (#{work.seq} of process group '{work.pg.group_tag}')"
    if isinstance(exc, HcclError):
        try:
            name = HcclResult(exc.code).name
        except ValueError:
            name = "HCCL error"
        err = dist.DistBackendError(f"{where} failed: {name} ({exc.code}): {exc.message}")
    elif isinstance(exc, NpuError):
        err = dist.DistBackendError(f"{where} failed: ACL error {exc.code}: {exc.message}")
    else:
        err = dist.DistBackendError(f"{where} failed inside npusim (a bug, please report it): "
                                    f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    err.__cause__ = exc
    return err
