"""``HcclError``: a collective failure, with its ``HcclResult`` code; and what HCCL's header says each code means.

``HcclError`` registers its kind with the runtime (``rt.errors.register_kind``) when this module is imported,
so an HCCL failure crossing the wire is rebuilt as an ``HcclError`` in the rank's process and on a card (which
imports it with HCCL's card extension, ``hccl/card/``).
"""

from __future__ import annotations

from rt.diag import slog
from rt.errors import NpuError, register_kind

# HcclResult (hicann/hcomm include/hccl/hccl_types.h): the header's description of each failure code, by name
# (the codes are hccl/types.py's HcclResult).
RESULT_TEXTS = {
    "HCCL_E_PARA": "parameter error", "HCCL_E_PTR": "empty pointer", "HCCL_E_MEMORY": "memory error",
    "HCCL_E_INTERNAL": "internal error", "HCCL_E_NOT_SUPPORT": "not support feature",
    "HCCL_E_NOT_FOUND": "not found specific resource", "HCCL_E_UNAVAIL": "resource unavailable",
    "HCCL_E_SYSCALL": "call system interface error", "HCCL_E_TIMEOUT": "timeout",
    "HCCL_E_OPEN_FILE_FAILURE": "open file fail", "HCCL_E_TCP_CONNECT": "tcp connect fail",
    "HCCL_E_ROCE_CONNECT": "roce connect fail", "HCCL_E_TCP_TRANSFER": "tcp transfer fail",
    "HCCL_E_ROCE_TRANSFER": "roce transfer fail", "HCCL_E_RUNTIME": "call runtime api fail",
    "HCCL_E_DRV": "call driver api fail", "HCCL_E_PROFILING": "call profiling api fail",
    "HCCL_E_CCE": "call cce api fail", "HCCL_E_NETWORK": "call network api fail",
    "HCCL_E_AGAIN": "try again", "HCCL_E_REMOTE": "error cqe",
    "HCCL_E_SUSPENDING": "error communicator suspending", "HCCL_E_OPRETRY_FAIL": "retry constraint",
    "HCCL_E_OOM": "out of memory", "HCCL_E_IN_STATUS": "the error information is in the status",
}
# HCCL_E_TIMEOUT, HCCL_E_REMOTE: a peer never arrived or is gone. CANN tags these EI0002.
PEER_CODES = (9, 21)


@register_kind
class HcclError(NpuError):
    """A collective (HCCL) failure; ``code`` is an ``HcclResult`` value such as 9 (timeout)."""

    kind = "hccl"
    log_module = slog.HCCL
    job_wide = True             # every rank's flight recorder dumps when a card reports one

    @property
    def from_peers(self) -> bool:
        return self.code in PEER_CODES


def hccl_para(message: str) -> HcclError:
    """The error of a bad argument to an HCCL call (HCCL_E_PARA): the ``error=`` of ``rt.args``' checks."""
    return HcclError(1, message)


def who_called(fps: dict) -> str:
    """'ranks 0-2 called X; rank 3 called Y' from ``{call: [ranks]}`` (ascending within each call, calls in the
    order of their lowest rank): how a mismatch between ranks is told."""
    out = []
    for fp, ranks in sorted(fps.items(), key=lambda kv: min(kv[1])):
        ranks = sorted(ranks)
        if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
            who = f"ranks {ranks[0]}-{ranks[-1]}"
        else:
            who = ("ranks " if len(ranks) > 1 else "rank ") + ",".join(map(str, ranks))
        out.append(f"{who} called {fp}")
    return "; ".join(out)
