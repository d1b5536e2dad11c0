"""Where the cards of ``rt.init()`` live, and how a context opens a channel to one.

- ``LocalCards`` (``backend="local"`` or ``NPUSIM_BACKEND=local``): cards as objects inside this process —
  no Ray, no sockets; what unit tests use.
- ``SocketDirCards``: a process started by ``launch`` or ``spawn`` (``NPUSIM_CARD_DIR`` set) talks to its
  node's card actors over their Unix sockets and never becomes a Ray driver.
- ``RayCards`` (default, ``rt/ray/backend.py``, a ``SocketDirCards``): card actors in a Ray session (an
  embedded one on 127.0.0.1, or a cluster given by ``address`` / ``RAY_ADDRESS``), reached over their Unix
  sockets.

``Runtime.init`` (``rt/host/runtime.py``) chooses one.
"""

from __future__ import annotations

import os
import threading
import time

from ..card.card import Card
from ..card.peers import Peers
from ..config import Config
from ..constants import AclErrorCode as E
from ..errors import AclError
from ..files import setup_dir
from ..wire.channel import LocalTransport, SocketTransport, card_key, socket_path


def card_wait() -> float:
    """Seconds a rank waits for its card to boot (NPUSIM_CARD_WAIT, read when used: a forked rank's own)."""
    return float(os.environ.get("NPUSIM_CARD_WAIT", "60"))


def _job_cards() -> set[int] | None:
    """The cards ``launch`` boots on each node of the job (NPUSIM_JOB_CARDS), None outside a launched job."""
    text = os.environ.get("NPUSIM_JOB_CARDS")
    try:
        return {int(x) for x in text.split(",") if x} if text else None
    except ValueError:
        return None


class Backoff:
    """Sleeps between looks for a card that is still booting: 1 ms at first (a card already up is found at
    once), growing by half each time to at most MAX_PAUSE — while a large world boots on a few cores, hundreds
    of ranks looking every few milliseconds would take CPU from the very cards they wait for. (No inotify:
    the stdlib has none, and its per-user instance limit, often 128, is below the ranks of a large world.)"""

    FIRST_PAUSE, MAX_PAUSE = 0.001, 0.1

    def __init__(self):
        self.pause = self.FIRST_PAUSE

    def sleep(self, deadline: float) -> None:
        """Sleep the next pause, never past ``deadline`` (time.monotonic())."""
        time.sleep(max(0.0, min(self.pause, deadline - time.monotonic())))
        self.pause = min(self.pause * 1.5, self.MAX_PAUSE)


class LocalCards:
    """Every card an object of this process, created on first use."""

    kind = "local"

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.node = 0
        self.cards: dict[int, Card] = {}
        self._lock = threading.Lock()

    def card(self, index: int) -> Card:
        with self._lock:
            card = self.cards.get(index)
            if card is None:
                c = self.cfg
                card = Card(node=0, index=index, capacity=c.hbm_bytes, soc_name=c.soc_name,
                            small_segment=c.small_segment_bytes, large_segment=c.large_segment_bytes,
                            cards_per_node=c.cards_per_node)
                card.peers = Peers(card, lambda i, on_msg, on_close: self.connect(i, on_msg, on_close))
                card.config = c
                card.fabric = "local"
                self.cards[index] = card
            return card

    def connect(self, index, on_message, on_close):
        return LocalTransport(self.card(index), on_message, on_close)

    def close(self) -> None:
        for card in list(self.cards.values()):
            card.peers.close()
            card.close()
        self.cards.clear()


class SocketDirCards:
    """The card actors of one node, found by their socket files in ``socket_dir``."""

    kind = "socket"

    def __init__(self, cfg: Config, socket_dir: str, node: int):
        self.cfg = cfg
        self.dir = socket_dir
        self.node = node
        self._key: bytes | None = None          # the set's key (rt/wire/channel.py), read at the first connect

    def path(self, index: int) -> str:
        return socket_path(self.dir, self.node, index)

    def connect(self, index, on_message, on_close):
        path = self.path(index)
        # Under launch the cards boot while the ranks start: give the card a bounded moment to appear.
        wait = card_wait()
        deadline = time.monotonic() + (wait if os.path.isdir(self.dir) else 0)
        pause = Backoff()
        booted = _job_cards()
        while not os.path.exists(path):
            if booted is not None and index not in booted:
                raise AclError(E.ACL_ERROR_RT_NO_DEVICE,
                               f"card {index} of node {self.node} is not part of this job: launch boots one card per "
                               f"rank, cards {sorted(booted)} here; to drive more cards from one rank, launch with "
                               f"--nproc {self.cfg.cards_per_node} (or as many ranks as cards you use)")
            if time.monotonic() >= deadline:
                raise AclError(E.ACL_ERROR_RT_NO_DEVICE,
                               f"card {index} of node {self.node} is not running (no socket at {path} after "
                               f"{wait:g} s; did the job end or the card fail to start?)")
            pause.sleep(deadline)
        if self._key is None:                   # once per card set: the directory's check and its key
            self._check_dir()
            self._key = card_key(self.dir)
        pause = Backoff()
        while True:
            try:
                return SocketTransport(path, on_message, on_close, key=self._key)
            except ConnectionRefusedError:      # bound but not listening yet
                if time.monotonic() >= deadline:
                    raise
                pause.sleep(deadline)

    def _check_dir(self) -> None:
        """The socket directory must be ours and private (not a squatter's, not a link): the key is read there."""
        setup_dir(self.dir, "card socket directory", create=False)

    def close(self) -> None:
        pass
