"""Warm cards: the card actors of one Ray session, lent to one job at a time and reset in between.

Booting a node's card actors costs seconds (a Ray worker each); a test suite that spawns many small jobs
would pay that every time. Within one Ray session — a pytest session fixture, a notebook, a long-lived
process, ``launch --up``'s cluster — a finished job's cards come back here instead of being destroyed:
each is ``reset`` (``CardActor.reset``: a brand-new ``Card`` — memory, streams, events, models, kernels,
extensions' state, statistics — with addresses past every one the last job saw, serving the same socket), and
the next job with the same shape (node, cards, hardware config) gets them at once. A card that fails its
reset, or a set whose actors died, is destroyed instead. ``drain()`` destroys every idle set; ``stop_ray``
calls it, and so does interpreter exit. The pool plugs into the session's hooks when imported: cards created
anywhere in this process first make room (``make_room``), and the session drains it before stopping.
"""

from __future__ import annotations

import atexit
import threading
import uuid

from ..config import Config
from . import session

RESET_TIMEOUT = 30.0
_lock = threading.Lock()
_idle: dict[tuple, list] = {}          # shape -> idle CardSets


def _shape(node: int, node_id: str | None, cfg: Config) -> tuple:
    return node, node_id, repr(sorted(cfg.to_dict().items()))


def acquire(job: str, node: int, node_id: str | None, cfg: Config, indices=None, wait: bool = True,
            count: int | None = None):
    """Every card of ``node`` (``count``: as many as it offers; a superset of the ``indices`` the job uses) for
    job ``job``: an idle warm set of
    that node and config, else a new one (which ``release`` keeps warm). Whole nodes are lent, so jobs of
    different sizes share one set instead of each holding a part of the node's ``NPU``; idle sets of another
    config on the node are destroyed first to free theirs."""
    count = cfg.cards_per_node if count is None else min(cfg.cards_per_node, count)   # what the node offers
    shape = _shape(node, node_id, cfg) + (count,)
    with _lock:
        sets = _idle.get(shape)
        cards = sets.pop() if sets else None
        others = [] if cards is not None else [c for k, group in _idle.items() if k[:2] == shape[:2] and k != shape
                                               for c in group]
        for k in [k for k in _idle if k[:2] == shape[:2] and k != shape]:
            del _idle[k]
    for old in others:
        session.destroy_cards(old)
    if cards is not None:
        cards.job, cards.warm = job, True
        return cards
    cards = session.create_cards(f"pool-{uuid.uuid4().hex[:10]}", node, node_id, cfg,
                                 indices=range(count), wait=wait)
    cards.job, cards.shape, cards.warm = job, shape, False
    return cards


def release(cards) -> None:
    """Reset a borrowed set and keep it for the next job; destroy it if a card cannot be reset."""
    shape = getattr(cards, "shape", None)
    if shape is None:
        session.destroy_cards(cards)
        return
    ray = session._ray()
    try:
        session.wait_cards(cards, timeout=RESET_TIMEOUT)           # a set whose boot was still pending
        ray.get([a.reset.remote() for a in cards.actors], timeout=RESET_TIMEOUT)
    except Exception:  # noqa: BLE001 - a dead or wedged card: this set is not reusable
        session.destroy_cards(cards)
        return
    with _lock:
        _idle.setdefault(shape, []).append(cards)


def drain() -> None:
    """Destroy every idle set (the session is ending)."""
    with _lock:
        sets = [c for group in _idle.values() for c in group]
        _idle.clear()
    ray = session._ray()
    if not ray.is_initialized():
        for cards in sets:                       # the actors went with the session: only the sockets remain
            session.forget_cards(cards)
        return
    for cards in sets:
        session.destroy_cards(cards)


def make_room(node_id: str | None, count: int) -> None:
    """Before new cards are created on ``node_id``: if the session lacks ``count`` free ``NPU``, destroy idle
    warm sets there — warm cards are a cache and must never keep another user of the session from its cards."""
    with _lock:
        mine = [(k, c) for k, group in _idle.items() if k[1] == node_id for c in group]
    if not mine:
        return
    ray = session._ray()
    try:
        free = float(ray.available_resources().get("NPU", 0))
    except Exception:  # noqa: BLE001 - no answer: make room to be safe
        free = 0.0
    if free >= count:
        return
    with _lock:
        for k in {k for k, _ in mine}:
            _idle.pop(k, None)
    for _, cards in mine:
        session.destroy_cards(cards)


def idle_count() -> int:
    with _lock:
        return sum(len(v) for v in _idle.values())


atexit.register(drain)
session.BEFORE_CREATE.append(make_room)
session.BEFORE_STOP.append(drain)
