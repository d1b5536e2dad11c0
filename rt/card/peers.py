"""How a card reaches the other cards of its node: their memory (mapped, zero-copy), their events, and any
command of theirs (an extension's too, e.g. HCCL asking for a control block).

A card holds one client connection to each peer it needs, made by ``connect(index, on_message, on_close)``
— a Unix socket to a card actor, or an in-process channel to a local card: the same commands either way.
Peer segments are mapped from file descriptors the peer sends (SCM_RIGHTS) and cached, so peer reads and
writes are plain memory copies.
"""

from __future__ import annotations

import threading

import numpy as np

from ..constants import AclErrorCode as E
from ..errors import AclError
from ..wire.client import CardClient
from ..wire.segment import map_received


def _cross_node(where, here) -> AclError:
    return AclError(E.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                    f"card {where[1]} of node {where[0]} is on another node than card {here[1]} (node {here[0]}): "
                    f"direct memory access only works between cards of one node")


class Peers:
    """The peers of ``card``; ``connect(index, on_message, on_close)`` opens a transport to card ``index``."""

    def __init__(self, card, connect):
        self.card = card
        self._connect = connect
        self._clients: dict[int, CardClient] = {}
        self._maps: dict[tuple[int, int], np.ndarray] = {}
        self._lock = threading.Lock()

    def client(self, index: int) -> CardClient:
        with self._lock:
            cl = self._clients.get(index)
            if cl is None or cl.lost:
                cl = CardClient(lambda m, c: self._connect(index, m, c), name=f"card {index} (node {self.card.node})",
                                label="peer card")
                self._clients[index] = cl
            return cl

    def call(self, index: int, name: str, *args, want_fds: bool = False):
        """Run command ``name`` on card ``index`` of this node."""
        return self.client(index).call(name, *args, want_fds=want_fds)

    def map(self, index: int, name: str, *args) -> np.ndarray:
        """uint8 view of the memory that command ``name`` on card ``index`` answers with ``(size, [fd])``."""
        size, fds = self.call(index, name, *args, want_fds=True)
        return map_received(fds, size)

    def segment(self, index: int, seg: int) -> np.ndarray:
        key = (index, seg)
        arr = self._maps.get(key)
        if arr is None:
            arr = self._maps[key] = self.map(index, "export_segment", seg)
        return arr

    def view(self, where, ptr, nbytes, what):
        if where[0] != self.card.node:
            raise _cross_node(where, (self.card.node, self.card.index))
        seg, off, _size = self.call(where[1], "locate", ptr, nbytes, what)
        return self.segment(where[1], seg)[off:off + nbytes]

    def wait_event(self, where, eid, gen, timeout):
        if where[0] != self.card.node:
            raise _cross_node(where, (self.card.node, self.card.index))
        self.client(where[1]).call(
            "event_wait", eid, gen, pass_req=True, timeout=timeout,
            timeout_error=lambda: AclError(E.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
                                           f"stream_wait_event: event {eid} of card {where[1]} not completed "
                                           f"within {timeout} s"))

    def close(self) -> None:
        for cl in self._clients.values():
            cl.close()
        self._clients.clear()
        self._maps.clear()
