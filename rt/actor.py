"""The Ray actor shell around one ``Card``: builds it, serves its Unix socket, links its peers."""

from __future__ import annotations

import os

import ray


@ray.remote
class CardActor:
    def __init__(self, node: int, index: int, cfg: dict, socket_dir: str):
        from .card import Card
        from .channel import CardServer
        from .config import Config
        from .peers import SocketPeers
        c = Config(**cfg)
        self.card = Card(node=node, index=index, capacity=c.hbm_bytes, soc_name=c.soc_name,
                         small_segment=c.small_segment_bytes, large_segment=c.large_segment_bytes,
                         cards_per_node=c.cards_per_node)
        self.card.peers = SocketPeers(self.card, socket_dir)
        self.card.config = c
        from hccl.service import RayRendezvous
        self.card.rendezvous = RayRendezvous()
        self.path = os.path.join(socket_dir, f"npu{node}_{index}.sock")
        self.server = CardServer(self.card, self.path)

    def address(self) -> str:
        return self.path

    def pid(self) -> int:
        return os.getpid()

    def ping(self) -> bool:
        return True

    def shutdown(self) -> None:
        self.server.close()
        self.card.peers.close()
        self.card.close()
