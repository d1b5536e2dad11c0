"""Cross-node coordination of one communicator: a small Ray actor every rank's card talks to.

Inside a node, cards synchronise through the shared control block; when a communicator spans nodes
there is no shared memory between them, so barriers, fingerprints and the bytes of inter-node
transfers go through Ray: this hub for the small control messages (an asyncio actor, so a waiting
barrier costs nothing) and Ray objects for the data (``ray.put`` on the sending card, fetched by the
receiving card from the object store of its own node).
"""

from __future__ import annotations

import asyncio

import ray


@ray.remote(num_cpus=0)
class HcclHub:
    def __init__(self, nranks: int):
        self.n = nranks
        self.waiters: dict[int, asyncio.Event] = {}
        self.fps: dict[int, dict[int, str]] = {}
        self.inputs: dict[int, dict[int, bytes]] = {}      # small collectives: seq -> rank -> input
        self.done = [0] * nranks
        self.slots: dict[tuple, list] = {}
        self.slot_events: dict[tuple, asyncio.Event] = {}

    def missing(self, seq: int) -> list[int]:
        """Ranks that have not arrived at collective ``seq``."""
        got = self.fps.get(seq, {})
        return [r for r in range(self.n) if r not in got]

    async def arrive(self, rank: int, seq: int, fingerprint: str, done: int) -> list[str]:
        """Rank ``rank`` called collective ``seq``; returns once every rank has: what each one called."""
        self.publish(rank, seq, fingerprint, done)
        got = self.fps[seq]
        if len(got) == self.n:
            ev = self.waiters.pop(seq, None)
            if ev is not None:
                ev.set()
        else:
            await self.waiters.setdefault(seq, asyncio.Event()).wait()
        return [got.get(r, "<nothing>") for r in range(self.n)]

    async def exchange(self, rank: int, seq: int, fingerprint: str, done: int, data: bytes) -> tuple[list, list]:
        """``arrive`` for a small collective, carrying the rank's input: returns every rank's fingerprint
        and input."""
        self.inputs.setdefault(seq, {})[rank] = data
        fps = await self.arrive(rank, seq, fingerprint, done)
        got = self.inputs[seq]
        return fps, [got.get(r, b"") for r in range(self.n)]

    def publish(self, rank: int, seq: int, fingerprint: str, done: int) -> None:
        self.fps.setdefault(seq, {})[rank] = fingerprint
        self.done[rank] = done
        for old in [s for s in self.fps if s < seq - 4]:
            del self.fps[old]
            self.inputs.pop(old, None)

    def last_done(self) -> list[int]:
        return list(self.done)

    async def deposit(self, key: tuple, refs: list) -> None:
        self.slots[key] = refs
        ev = self.slot_events.pop(key, None)
        if ev is not None:
            ev.set()

    async def collect(self, key: tuple) -> list:
        if key not in self.slots:
            ev = self.slot_events.setdefault(key, asyncio.Event())
            await ev.wait()
        return self.slots.pop(key)


def get_hub(comm_id: str, nranks: int):
    """The hub of ``comm_id`` (created by whichever card asks first)."""
    return HcclHub.options(name=f"hccl-hub:{comm_id}", namespace="npusim", get_if_exists=True,
                           lifetime=None).remote(nranks)
