"""HCCL's Ray transport: how card actors meet, and what crosses nodes (see ``hccl/transport/base.py``).

- Rendezvous: every rank's card joins the job's board (``JobBoard`` of ``rt/ray/actor.py``, created with the
  job's cards: rt's blocking rendezvous by key as an actor), bounded by ``HCCL_CONNECT_TIMEOUT`` — no polling.
- A communicator that spans nodes gets a hub: a small asyncio actor (a waiting arrival costs nothing)
  for the control messages of its collectives, and Ray objects for the data (``ray.put`` on the sending
  card, fetched by the receiving card from its own node's object store).

Every Ray failure is turned into an ``HcclError`` here; the card-side endpoint never sees Ray.
"""

from __future__ import annotations

import asyncio

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from rt.ray.actor import job_board

from ..errors import HcclError
from ..types import HcclResult
from .base import init_timeout, members

CONTROL_TIMEOUT = 30.0     # seconds for a hub's own bookkeeping calls (missing ranks, last done)


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


class RayTransport:
    """The transport of card actors (one per card)."""

    def __init__(self, namespace: str):
        self.namespace = namespace             # the job's: its card actors and hubs are named there
        self._board = None

    def rendezvous(self, comm_id: str, nranks: int, rank: int, info: list, timeout: float) -> list:
        if self._board is None:
            self._board = job_board(self.namespace)
        try:
            got = ray.get(self._board.join.remote(f"hccl/{comm_id}", nranks, rank, info, timeout),
                          timeout=timeout + CONTROL_TIMEOUT)
        except GetTimeoutError:
            raise init_timeout(comm_id, nranks, [], timeout) from None
        except RayActorError as e:
            raise HcclError(HcclResult.HCCL_E_REMOTE, f"comm init '{comm_id}': the job's rendezvous board "
                                                      f"died: {e}") from None
        return members(got, comm_id, nranks, rank, timeout)

    def hub(self, comm_id: str, nranks: int) -> "Hub":
        return Hub(comm_id, HcclHub.options(name=f"hccl-hub:{comm_id}", namespace=self.namespace,
                                            get_if_exists=True, lifetime=None).remote(nranks))


class Hub:
    """One communicator's hub as its endpoints use it: blocking calls, Ray failures as HcclErrors."""

    def __init__(self, comm_id: str, actor):
        self.comm_id = comm_id
        self.actor = actor

    def _get(self, ref, what: str, seq: int, timeout: float):
        try:
            return ray.get(ref, timeout=timeout)
        except GetTimeoutError:
            raise self._timeout(what, seq, timeout) from None
        except RayActorError as e:
            raise HcclError(HcclResult.HCCL_E_REMOTE, f"{what}: the communicator's hub died: {e}") from None
        except RayError as e:
            raise HcclError(HcclResult.HCCL_E_REMOTE, f"{what}: cross-node transfer failed: {e}") from None

    def _timeout(self, what: str, seq: int, timeout: float) -> HcclError:
        try:
            missing = ray.get(self.actor.missing.remote(seq), timeout=CONTROL_TIMEOUT)
            last = ray.get(self.actor.last_done.remote(), timeout=CONTROL_TIMEOUT)
            detail = f"waiting for ranks {missing}; " + "; ".join(
                f"rank {r}: last completed collective #{last[r]}" for r in missing)
        except RayError:
            detail = "and the hub does not answer"
        return HcclError(HcclResult.HCCL_E_TIMEOUT,
                         f"{what}: EI0002 timed out after {timeout:g} s (HCCL_EXEC_TIMEOUT) {detail}")

    def arrive(self, rank: int, seq: int, fingerprint: str, done: int, what: str, timeout: float) -> list[str]:
        """Every rank (all nodes) has called collective ``seq``: what each one called."""
        return self._get(self.actor.arrive.remote(rank, seq, fingerprint, done), what, seq, timeout)

    def exchange(self, rank: int, seq: int, fingerprint: str, done: int, data: bytes, what: str,
                 timeout: float) -> tuple[list, list]:
        """``arrive`` carrying this rank's input: every rank's fingerprint and input."""
        return self._get(self.actor.exchange.remote(rank, seq, fingerprint, done, data), what, seq, timeout)

    def send(self, key: tuple, array: np.ndarray) -> None:
        """Leave a copy of ``array`` for the rank that fetches ``key`` (a transfer of one schedule step)."""
        self.actor.deposit.remote(key, [ray.put(np.ascontiguousarray(array))])

    def recv(self, key: tuple, what: str, seq: int, timeout: float) -> np.ndarray:
        refs = self._get(self.actor.collect.remote(key), what, seq, timeout)
        return self._get(refs[0], what, seq, timeout)
