"""HCCL's Ray transport: how card actors meet, and what crosses nodes (see ``hccl/transport/base.py``).

- Rendezvous: every rank's card joins the job's board (``JobBoard`` of ``rt/ray/actor.py``, created with the
  job's cards: rt's blocking rendezvous by key as an actor), bounded by ``HCCL_CONNECT_TIMEOUT`` — no polling.
  Along with its ``[node, card, pid]`` each card publishes where its process's direct link listens
  (``link.py``: its node's address as Ray knows it, a port, a token); Ray carries nothing after init.
- A communicator that spans nodes gets a hub (``direct.py``): its collectives' rounds between the groups of
  ranks sharing a process (one leader each crosses processes), step data sent straight to the receiving
  rank's process.

Every Ray failure is turned into an ``HcclError`` here; the card-side endpoint never sees Ray.
"""

from __future__ import annotations

import threading

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from rt.ray.actor import job_board

from ..errors import HcclError
from ..types import HcclResult
from . import link
from .base import init_timeout, members
from .direct import DirectHub, group_of

CONTROL_TIMEOUT = 30.0     # seconds beyond HCCL_CONNECT_TIMEOUT for the board's own answer


class RayTransport:
    """The transport of card actors (one per card)."""

    def __init__(self, namespace: str):
        self.namespace = namespace             # the job's: its card actors are named there
        self._board = None
        self._joined: dict[str, tuple[int, list, list]] = {}     # comm id -> (rank, link addresses, nodes)
        self._lock = threading.Lock()

    def rendezvous(self, comm_id: str, nranks: int, rank: int, info: list, timeout: float) -> list:
        if self._board is None:
            self._board = job_board(self.namespace)
        me = link.server(ray.util.get_node_ip_address())
        try:
            got = ray.get(self._board.join.remote(f"hccl/{comm_id}", nranks, rank, [*info, me.address], timeout),
                          timeout=timeout + CONTROL_TIMEOUT)
        except GetTimeoutError:
            raise init_timeout(comm_id, nranks, [], timeout) from None
        except RayActorError as e:
            raise HcclError(HcclResult.HCCL_E_REMOTE, f"comm init '{comm_id}': the job's rendezvous board "
                                                      f"died: {e}") from None
        infos = members(got, comm_id, nranks, rank, timeout)
        nodes = [m[0] for m in infos]
        if len(set(nodes)) > 1:                  # the endpoint asks for the hub next
            with self._lock:
                self._joined[comm_id] = (rank, [m[-1] for m in infos], nodes)
        return [m[:-1] for m in infos]

    def link_host(self) -> str:
        """The address this card's node listens on (for the rank processes of its node too)."""
        return ray.util.get_node_ip_address()

    def hub(self, comm_id: str, nranks: int) -> DirectHub:
        """The cross-node hub of this card's rank of ``comm_id`` (right after its rendezvous)."""
        with self._lock:
            rank, addresses, nodes = self._joined.pop(comm_id)
        return DirectHub(group_of(comm_id, link.server(ray.util.get_node_ip_address()), addresses, nodes), rank)
