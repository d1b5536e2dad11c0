"""How a card reaches the other cards of its node: their memory (mapped, zero-copy) and their events.

``LocalPeers`` serves in-process cards (the test backend); ``SocketPeers`` talks to peer card actors
over their Unix sockets, maps their segments from file descriptors passed with SCM_RIGHTS and caches
the mappings, so peer reads and writes are plain memory copies.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from .channel import SocketTransport
from .client import CardClient
from .constants import AclErrorCode as E
from .errors import AclError
from .segment import map_received


def _cross_node(where, here) -> AclError:
    return AclError(E.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                    f"card {where[1]} of node {where[0]} is on another node than card {here[1]} (node {here[0]}): "
                    f"direct memory access only works between cards of one node")


class LocalPeers:
    def __init__(self, card, cards: dict):
        self.card = card
        self.cards = cards          # index -> Card, shared by all in-process cards

    def _peer(self, where):
        if where[0] != self.card.node or where[1] not in self.cards:
            raise _cross_node(where, (self.card.node, self.card.index))
        return self.cards[where[1]]

    def view(self, where, ptr, nbytes, what):
        return self._peer(where).memory.view(ptr, nbytes, what=what)

    def segment(self, index: int, seg: int, size=None) -> np.ndarray:
        return self._peer((self.card.node, index)).memory.segment(seg).array

    def ctrl_array(self, index: int, comm_id: str, nbytes: int) -> np.ndarray:
        return self._peer((self.card.node, index)).hccl.ctrl_array(comm_id, nbytes)

    def wait_event(self, where, eid, gen, timeout):
        ev = self._peer(where)._event(eid)
        if not ev.wait(gen, timeout):
            raise AclError(E.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
                           f"stream_wait_event: event {eid} of card {where[1]} not completed within {timeout} s")


class SocketPeers:
    def __init__(self, card, socket_dir: str):
        self.card = card
        self.dir = socket_dir
        self._clients: dict[int, CardClient] = {}
        self._maps: dict[tuple[int, int], np.ndarray] = {}
        self._lock = threading.Lock()

    def client(self, index: int) -> CardClient:
        with self._lock:
            cl = self._clients.get(index)
            if cl is None or cl.lost:
                path = os.path.join(self.dir, f"npu{self.card.node}_{index}.sock")
                if not os.path.exists(path):
                    raise AclError(E.ACL_ERROR_RT_NO_DEVICE,
                                   f"card {index} of node {self.card.node} is not running (no socket at {path})")
                cl = CardClient(lambda m, c: SocketTransport(path, m, c), name=f"card {index} (node {self.card.node})")
                self._clients[index] = cl
            return cl

    def segment(self, index: int, seg: int, size=None) -> np.ndarray:
        key = (index, seg)
        arr = self._maps.get(key)
        if arr is None:
            arr = self._maps[key] = self._map(self.client(index).call("export_segment", seg, want_fds=True))
        return arr

    def ctrl_array(self, index: int, comm_id: str, nbytes: int) -> np.ndarray:
        """Map the HCCL control block of ``comm_id`` held by card ``index`` (created there on demand)."""
        return self._map(self.client(index).call("hccl_ctrl", comm_id, nbytes, want_fds=True))

    def ctrl_fd(self, index: int, comm_id: str, nbytes: int) -> tuple[int, list[int]]:
        """``(size, [fd])`` of that control block, the fd ours to pass on and close."""
        return self.client(index).call("hccl_ctrl", comm_id, nbytes, want_fds=True)

    @staticmethod
    def _map(reply) -> np.ndarray:
        size, fds = reply
        return map_received(fds, size)

    def view(self, where, ptr, nbytes, what):
        if where[0] != self.card.node:
            raise _cross_node(where, (self.card.node, self.card.index))
        seg, off, size = self.client(where[1]).call("locate", ptr, nbytes, what)
        return self.segment(where[1], seg, size)[off:off + nbytes]

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
