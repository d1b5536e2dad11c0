"""The Ray actor shells: ``CardActor`` around one ``Card`` (builds it, serves its Unix socket, links its
peers), and ``JobBoard``, where the cards of one job meet (``rt/rendezvous.py`` as a job-wide actor, for the
packages that extend the card)."""

from __future__ import annotations

import os

import ray

from ..rendezvous import Rendezvous

BOARD_NAME = "npusim-board"        # one per job, in the job's Ray namespace


@ray.remote(num_cpus=0, max_concurrency=256)
class JobBoard:
    """The job's ``Rendezvous``. A threaded actor: a waiting party holds one of its threads, never a card's."""

    def __init__(self):
        self._meeting = Rendezvous()

    def join(self, key: str, count: int, index: int, value, timeout: float) -> dict:
        """``Rendezvous.join`` of the job's cards."""
        return self._meeting.join(key, count, index, value, timeout)


def job_board(namespace: str):
    """The board of the job whose actors live in ``namespace`` (created by the first who asks)."""
    return JobBoard.options(name=BOARD_NAME, namespace=namespace, get_if_exists=True).remote()



@ray.remote
class CardActor:
    """One card, serving its Unix socket. Between jobs a warm card is ``reset``: the card is rebuilt from
    scratch (memory, streams, events, models, kernels, extensions' state, statistics), its addresses start
    past every address the last job saw, and the socket is served again — only the actor process stays."""

    def __init__(self, node: int, index: int, cfg: dict, socket_dir: str, namespace: str, key: bytes):
        """``key``: the card set's key (``rt/wire/channel.py``), handed over Ray's authenticated channel; the
        card admits only connections presenting it, and presents it to its peers."""
        from ..config import Config
        from ..wire.channel import socket_path
        self.node, self.index, self.cfg, self.namespace = node, index, Config(**cfg), namespace
        self.socket_dir, self.key = socket_dir, bytes(key)
        self.path = socket_path(socket_dir, node, index)
        self.jobs = 0
        self._build(None)

    def _build(self, va_start) -> None:
        from ..card.card import Card
        from ..card.peers import Peers
        from ..wire.channel import SocketTransport, socket_path
        from ..wire.server import CardServer
        c = self.cfg
        self.card = Card(node=self.node, index=self.index, capacity=c.hbm_bytes, soc_name=c.soc_name,
                         small_segment=c.small_segment_bytes, large_segment=c.large_segment_bytes,
                         cards_per_node=c.cards_per_node, va_start=va_start)
        self.card.peers = Peers(self.card, lambda i, on_msg, on_close: SocketTransport(
            socket_path(self.socket_dir, self.node, i), on_msg, on_close, key=self.key))
        self.card.config = c
        self.card.fabric = "ray"
        self.card.scope = self.namespace     # the job's Ray namespace: where the job's cards and hubs are named
        # the set's owner made (and removes) the directory
        self.server = CardServer(self.card, self.path, make_dir=False, key=self.key)

    def address(self) -> str:
        return self.path

    def pid(self) -> int:
        return os.getpid()

    def ping(self) -> bool:
        return True

    def reset(self) -> int:
        """Make the card as new for the next job (see the class docstring); returns how many jobs it served."""
        va = self.card.memory.next_va_start()
        self._close()
        self._build(va)
        self.jobs += 1
        return self.jobs

    def _close(self) -> None:
        self.server.close()
        self.card.peers.close()
        self.card.close()

    def shutdown(self) -> None:
        self._close()
