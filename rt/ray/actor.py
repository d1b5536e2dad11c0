"""The Ray actor shells: ``CardActor`` around one ``Card`` (builds it, serves its Unix socket, links its
peers), ``CardHost`` around several (a node's cards, booted in one Ray worker), and
``JobBoard``, where the cards of one job meet (``rt/rendezvous.py`` as a job-wide actor, for the packages that
extend the card).

How cards map to processes (``launcher/launch/ray_backend.py``'s ``cards_per_host``): ``launch`` boots a node's
cards in one ``CardHost`` — a Ray worker costs ~0.3 s of CPU to boot before any card code runs and ~60 MiB, and
eight of them took seconds on a 2-core laptop — where each card keeps its own memory, streams, socket and serving
threads exactly as in its own process, but they share the host's process (and die together). A ``CardActor``
per card (a card that dies takes only itself) where isolation matters: a job injecting ``kill_card``,
``NPUSIM_CARDS_PER_HOST=1``, and the warm cards of a long-lived session (``pool.py``)."""

from __future__ import annotations

import os
import threading

import ray

from ..rendezvous import MAX_WAIT

BOARD_NAME = "npusim-board"        # one per job, in the job's Ray namespace


BOARD_THREADS = 256                # a waiting party holds a thread (each ~30 KiB): more for a larger world


@ray.remote(num_cpus=0, max_concurrency=BOARD_THREADS)
class JobBoard:
    """The job's rendezvous by key (the contract of ``rt/rendezvous.py``'s ``Rendezvous.join``). A threaded actor: a
    waiting party holds one of its threads, never a card's; it is woken once, when the last party of its key
    arrives (an event per key: joining never wakes the others), so a world of N ranks costs O(N), not O(N^2).
    Created with threads for the job's world (``job_board(..., parties)``): all of it may wait at once."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[str, dict] = {}
        self._complete: dict[str, int] = {}          # keys every party joined: their size (for ``joined``)

    def join(self, key: str, count: int, index: int, value, timeout: float) -> dict:
        """``{"values": [...]}`` once all ``count`` joined; ``{"joined": [...]}`` on timeout; ``{"twice": True}``
        if ``index`` already joined. ``timeout`` is kept finite and >= 0 (inf, nan: see ``rt/rendezvous.py``)."""
        timeout = float(min(timeout, MAX_WAIT)) if timeout >= 0 else 0.0       # nan >= 0 is False
        with self._lock:
            entry = self._entries.setdefault(key, {"values": {}, "left": count, "count": count,
                                                   "done": threading.Event()})
            if index in entry["values"]:
                return {"twice": True}
            entry["values"][index] = value
            if len(entry["values"]) >= count:
                entry["done"].set()
        if not entry["done"].wait(timeout):
            with self._lock:
                if not entry["done"].is_set():
                    return {"joined": sorted(entry["values"])}
        with self._lock:
            values = [entry["values"][i] for i in range(count)]
            entry["left"] -= 1
            if not entry["left"]:                # the last party out forgets the key
                self._entries.pop(key, None)
                if len(self._complete) >= 256:
                    self._complete.pop(next(iter(self._complete)))
                self._complete[key] = count
        return {"values": values}

    def joined(self, prefix: str) -> tuple[int, int]:
        """(parties joined, parties expected) of the most advanced key starting with ``prefix`` ((0, 0): none yet)
        — what ``launch`` reports as "ranks joined n/N"."""
        with self._lock:
            best = (0, 0)
            for key, n in self._complete.items():
                if key.startswith(prefix):
                    best = max(best, (n, n))
            for key, entry in self._entries.items():
                if key.startswith(prefix):
                    best = max(best, (len(entry["values"]), entry["count"]))
        return best


def job_board(namespace: str, parties: int = 0):
    """The board of the job whose actors live in ``namespace`` (created by the first who asks, with a thread for
    each of ``parties`` ranks that may wait at once, plus some)."""
    return JobBoard.options(name=BOARD_NAME, namespace=namespace, get_if_exists=True,
                            max_concurrency=max(BOARD_THREADS, int(parties) + 64)).remote()



class ServedCard:
    """One card serving its Unix socket inside whichever actor holds it."""

    def __init__(self, node: int, index: int, cfg, socket_dir: str, namespace: str, key: bytes):
        """``key``: the card set's key (``rt/wire/channel.py``), handed over Ray's authenticated channel; the
        card admits only connections presenting it, and presents it to its peers."""
        from ..wire.channel import socket_path
        self.node, self.index, self.cfg, self.namespace = node, index, cfg, namespace
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

    def reset(self) -> int:
        """Make the card as new for the next job: rebuilt from scratch (memory, streams, events, models,
        kernels, extensions' state, statistics), addresses past every one the last job saw, the same socket."""
        va = self.card.memory.next_va_start()
        self.close()
        self._build(va)
        self.jobs += 1
        return self.jobs

    def close(self) -> None:
        self.server.close()
        self.card.peers.close()
        self.card.close()


@ray.remote
class CardActor:
    """One card, serving its Unix socket. Between jobs a warm card is ``reset`` (``ServedCard.reset``) — only
    the actor process stays."""

    def __init__(self, node: int, index: int, cfg: dict, socket_dir: str, namespace: str, key: bytes):
        from ..config import Config
        self.served = ServedCard(node, index, Config(**cfg), socket_dir, namespace, key)

    def address(self) -> str:
        return self.served.path

    def pid(self) -> int:
        return os.getpid()

    def ping(self) -> bool:
        return True

    def reset(self) -> int:
        """Make the card as new for the next job; returns how many jobs it served."""
        return self.served.reset()

    def shutdown(self) -> None:
        self.served.close()


@ray.remote
class CardHost:
    """Several cards of one node in one Ray worker, booted in one step (see the module docstring)."""

    def __init__(self, node: int, indices: list, cfg: dict, socket_dir: str, namespace: str, key: bytes):
        from ..config import Config
        config = Config(**cfg)
        self.cards = [ServedCard(node, i, config, socket_dir, namespace, key) for i in indices]

    def address(self) -> list:
        """Every hosted card's socket path (all of them serve once this returns)."""
        return [c.path for c in self.cards]

    def pid(self) -> int:
        return os.getpid()

    def ping(self) -> bool:
        return True

    def reset(self) -> int:
        """Make every hosted card as new for the next job; returns how many jobs they served."""
        return min(c.reset() for c in self.cards)

    def shutdown(self) -> None:
        for c in self.cards:
            c.close()
