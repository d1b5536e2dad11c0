"""The transport of cards that live in one process (``rt.init(backend="local")``): one node, no Ray."""

from __future__ import annotations

from rt.rendezvous import Rendezvous

from ..errors import HcclError
from ..types import HcclResult
from .base import members

_MEETING = Rendezvous()             # shared by every card of this process, keyed by comm id


class InProcessTransport:
    def rendezvous(self, comm_id: str, nranks: int, rank: int, info: list, timeout: float) -> list:
        return members(_MEETING.join(comm_id, nranks, rank, info, timeout), comm_id, nranks, rank, timeout)

    def link_host(self) -> None:
        return None

    def hub(self, comm_id: str, nranks: int):
        raise HcclError(HcclResult.HCCL_E_NOT_SUPPORT,
                        f"comm '{comm_id}' spans nodes, which in-process cards cannot (they are all node 0)")
