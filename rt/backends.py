"""Where the cards of ``rt.init()`` live, and how a context opens a channel to one.

- ``RayBackend`` (default): card actors in a Ray session (an embedded one on 127.0.0.1, or a
  cluster given by ``address`` / ``RAY_ADDRESS``), reached over their Unix sockets.
- ``SocketDirBackend``: a process started by ``launch`` or ``spawn`` (``NPUSIM_CARD_DIR`` set) talks
  to its node's card actors directly and never becomes a Ray driver.
- ``LocalBackend`` (``backend="local"`` or ``NPUSIM_BACKEND=local``): cards as objects inside this
  process — no Ray, no sockets; what unit tests use.
"""

from __future__ import annotations

import os
import shutil
import threading
import time

from .channel import LocalTransport, SocketTransport
from .config import Config
from .constants import AclErrorCode as E
from .errors import AclError


CARD_WAIT = float(os.environ.get("NPUSIM_CARD_WAIT", "60"))   # seconds a rank waits for its card to boot


class LocalBackend:
    kind = "local"

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.node = 0
        self.cards: dict[int, object] = {}
        self._lock = threading.Lock()
        from hccl.service import LocalRendezvous
        self.rendezvous = LocalRendezvous()   # shared by this process's cards

    def card(self, index: int):
        from .card import Card
        from .peers import LocalPeers
        with self._lock:
            card = self.cards.get(index)
            if card is None:
                c = self.cfg
                card = Card(node=0, index=index, capacity=c.hbm_bytes, soc_name=c.soc_name,
                            small_segment=c.small_segment_bytes, large_segment=c.large_segment_bytes,
                            cards_per_node=c.cards_per_node)
                card.peers = LocalPeers(card, self.cards)
                card.config = c
                card.rendezvous = self.rendezvous
                self.cards[index] = card
            return card

    def connect(self, index, on_message, on_close):
        return LocalTransport(self.card(index), on_message, on_close)

    def close(self) -> None:
        for card in self.cards.values():
            card.close()
        self.cards.clear()


class SocketDirBackend:
    kind = "socket"

    def __init__(self, cfg: Config, socket_dir: str, node: int):
        self.cfg = cfg
        self.dir = socket_dir
        self.node = node

    def path(self, index: int) -> str:
        return os.path.join(self.dir, f"npu{self.node}_{index}.sock")

    def connect(self, index, on_message, on_close):
        path = self.path(index)
        # Under launch the cards boot while the ranks start: give the card a bounded moment to appear.
        deadline = time.monotonic() + (CARD_WAIT if os.path.isdir(self.dir) else 0)
        while not os.path.exists(path):
            if time.monotonic() >= deadline:
                raise AclError(E.ACL_ERROR_RT_NO_DEVICE,
                               f"card {index} of node {self.node} is not running (no socket at {path} after "
                               f"{CARD_WAIT:g} s; did the job end or the card fail to start?)")
            time.sleep(0.02)
        while True:
            try:
                return SocketTransport(path, on_message, on_close)
            except ConnectionRefusedError:      # bound but not listening yet
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)

    def close(self) -> None:
        pass


class RayBackend(SocketDirBackend):
    kind = "ray"

    def __init__(self, cfg: Config, address: str | None):
        from . import session
        if address:
            session.connect_ray(address)
        else:
            session.start_local_ray(cfg)
        import atexit
        import ray
        from .context import _finalize_at_exit
        atexit.register(_finalize_at_exit)     # atexit is LIFO: release our cards before Ray's own shutdown
        nodes = session.nodes_with_npus()
        here = ray.get_runtime_context().get_node_id()
        ids = [n["node_id"] for n in nodes]
        if here not in ids:
            raise AclError(E.ACL_ERROR_RT_NO_DEVICE, "this Ray node offers no 'NPU' resource: start it with "
                                                     "ray start --resources='{\"NPU\": 8}'")
        self.node_id = here
        self.job = os.environ.get("NPUSIM_JOB") or ray.get_runtime_context().get_job_id()
        super().__init__(cfg, os.path.join(session.socket_root(), f"ray-{self.job}"), ids.index(here))
        self.cardsets = []
        self._lock = threading.Lock()

    def connect(self, index, on_message, on_close):
        from . import session
        with self._lock:
            if not os.path.exists(self.path(index)):
                # start every visible card of the node at once: actors start in parallel (~2 s for 8),
                # one at a time they cost ~1.5 s each as the program touches them
                from .context import RUNTIME
                wanted = sorted({index, *RUNTIME.visible})
                missing = [i for i in wanted if not os.path.exists(self.path(i))]
                self.cardsets.append(session.create_cards(self.job, self.node, self.node_id, self.cfg,
                                                          socket_dir=self.dir, indices=missing))
        return super().connect(index, on_message, on_close)

    def close(self) -> None:
        import ray
        from . import session
        created = bool(self.cardsets)
        if ray.is_initialized():               # else Ray already went down (interpreter exit): its actors too
            for cs in self.cardsets:
                session.destroy_cards(cs)
        self.cardsets = []
        if created:             # only the creator removes the job's socket dir: others still use it
            shutil.rmtree(self.dir, ignore_errors=True)
        session.stop_ray()


def choose(cfg: Config, *, address=None, backend=None):
    backend = backend or os.environ.get("NPUSIM_BACKEND")
    card_dir = os.environ.get("NPUSIM_CARD_DIR")
    if backend == "local":
        return LocalBackend(cfg)
    if card_dir and not address and backend in (None, "socket"):
        return SocketDirBackend(cfg, card_dir, int(os.environ.get("NPUSIM_NODE", "0")))
    if backend not in (None, "ray", "socket"):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"init: unknown backend {backend!r} (expected 'ray' or 'local')")
    return RayBackend(cfg, address or os.environ.get("RAY_ADDRESS"))
