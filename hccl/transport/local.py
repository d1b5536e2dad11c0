"""The transport of cards that live in one process (``rt.init(backend="local")``): one node, no Ray."""

from __future__ import annotations

import threading
import time

from rt.errors import HcclError

from ..types import HcclResult
from .base import init_timeout

_table: dict[str, dict[int, list]] = {}      # comm id -> rank -> info, shared by every card of this process
_left: dict[str, int] = {}                   # comm id -> ranks that have not returned yet
_cv = threading.Condition()


class LocalTransport:
    def rendezvous(self, comm_id: str, nranks: int, rank: int, info: list, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        with _cv:
            members = _table.setdefault(comm_id, {})
            if rank in members:
                raise HcclError(HcclResult.HCCL_E_PARA, f"comm '{comm_id}': rank {rank} joined twice")
            members[rank] = info
            _cv.notify_all()
            while len(members) < nranks:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise init_timeout(comm_id, nranks, sorted(members), timeout)
                _cv.wait(left)
            out = [members[r] for r in range(nranks)]
            _left[comm_id] = _left.get(comm_id, nranks) - 1
            if not _left[comm_id]:                   # the last rank out forgets the communicator
                del _table[comm_id], _left[comm_id]
            return out

    def hub(self, comm_id: str, nranks: int):
        raise HcclError(HcclResult.HCCL_E_NOT_SUPPORT,
                        f"comm '{comm_id}' spans nodes, which in-process cards cannot (they are all node 0)")
