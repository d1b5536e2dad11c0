"""What a torch user sees when a collective fails: ``torch.distributed.DistBackendError`` carrying npusim's
diagnosis — the rank, the collective and its sequence number, HCCL's code and name, CANN's error tag
(``EI0002`` for a peer that never arrived or is gone) — and the values that did not match."""

from __future__ import annotations

import traceback

import torch.distributed as dist

from hccl.errors import HcclError
from hccl.types import HcclResult
from rt.errors import NpuError


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
