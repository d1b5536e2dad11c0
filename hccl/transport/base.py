"""How the cards of a communicator find each other and move what cannot go through shared memory.

Inside a node, cards synchronise and move data through the communicator's shared control block and each
other's mapped memory (``hccl/protocol/``); what crosses that boundary goes through a transport:

- ``rendezvous(comm_id, nranks, rank, info, timeout)``: every rank's card publishes ``info`` and waits
  for all of them (bounded by ``HCCL_CONNECT_TIMEOUT``); returns the infos in rank order, or raises
  ``HCCL_E_TIMEOUT`` naming the ranks that never joined;
- ``hub(comm_id, nranks)``: for a communicator that spans nodes (asked for right after its rendezvous), what
  its collectives do across nodes: ``arrive`` (every rank's call), ``small`` (a small collective in one
  round: inputs in, this rank's result out), ``send``/``recv`` of schedule-step data between two ranks, and
  ``left`` (a rank's process died) — every failure an ``HcclError`` naming the call (``direct.py``).

``InProcessTransport`` (``local.py``) serves cards living in one process (``backend="local"``: one node);
``RayTransport`` (``ray.py``) serves card actors and is the only place HCCL touches Ray (their rendezvous); its
hubs talk over direct links between card processes (``direct.py``, ``link.py``). Both meet through
rt's generic rendezvous (``rt/rendezvous.py``); ``fabric.py`` picks the one of a card.
"""

from __future__ import annotations

from ..errors import HcclError
from ..types import HcclResult


def init_timeout(comm_id: str, nranks: int, joined, timeout: float) -> HcclError:
    missing = [r for r in range(nranks) if r not in joined]
    return HcclError(HcclResult.HCCL_E_TIMEOUT,
                     f"comm init '{comm_id}': EI0006 ranks {missing} never joined within {timeout:g} s "
                     f"(HCCL_CONNECT_TIMEOUT); joined: {sorted(joined)}")


def members(got: dict, comm_id: str, nranks: int, rank: int, timeout: float) -> list:
    """Every rank's info from a ``Rendezvous.join`` answer, or the HcclError it means."""
    if got.get("twice"):
        raise HcclError(HcclResult.HCCL_E_PARA, f"comm '{comm_id}': rank {rank} joined twice")
    if "values" not in got:
        raise init_timeout(comm_id, nranks, got["joined"], timeout)
    return got["values"]
