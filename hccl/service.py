"""The per-card HCCL service: communicator endpoints, rendezvous, control blocks, schedule cache.

The card (``rt/card.py``) forwards ``hccl_*`` commands and tasks here. Communicator init waits for
every rank in a rendezvous keyed by the communicator id (through Ray's KV store for card actors, an
in-process table for local cards), bounded by ``HCCL_CONNECT_TIMEOUT``, and names the ranks that
never joined. Environment-controlled behaviour (timeouts, HCCL_ALGO) comes from the *calling
process's* environment, sent along with each request.
"""

from __future__ import annotations

import functools
import os
import threading
import time

from rt.errors import HcclError
from rt.segment import Segment

from . import algos
from .cardside import CLOSED, HOST_GONE, Endpoint
from .types import HcclResult, np_dtype


HUB_GRACE = 60.0    # seconds a card keeps a destroyed communicator's hub alive for the slower ranks


class LocalRendezvous:
    """Rendezvous for in-process cards (the local backend)."""

    def __init__(self):
        self.table: dict[str, dict[int, list]] = {}
        self.cv = threading.Condition()

    def join(self, comm_id: str, nranks: int, rank: int, info: list, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        with self.cv:
            members = self.table.setdefault(comm_id, {})
            if rank in members:
                raise HcclError(HcclResult.HCCL_E_PARA, f"comm '{comm_id}': rank {rank} joined twice")
            members[rank] = info
            self.cv.notify_all()
            while len(members) < nranks:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _init_timeout(comm_id, nranks, sorted(members), timeout)
                self.cv.wait(left)
            return [members[r] for r in range(nranks)]


class RayRendezvous:
    """Rendezvous for card actors through Ray's internal KV store (no extra ports)."""

    def join(self, comm_id: str, nranks: int, rank: int, info: list, timeout: float) -> list:
        import msgpack
        from ray.experimental import internal_kv as kv
        prefix = f"hccl/{comm_id}/"
        if kv._internal_kv_put(f"{prefix}{rank}", msgpack.packb(info), overwrite=False, namespace="npusim"):
            raise HcclError(HcclResult.HCCL_E_PARA, f"comm '{comm_id}': rank {rank} joined twice")
        deadline = time.monotonic() + timeout
        found: dict[int, list] = {}
        delay = 0.005
        while True:
            for r in range(nranks):
                if r not in found:
                    v = kv._internal_kv_get(f"{prefix}{r}", namespace="npusim")
                    if v is not None:
                        found[r] = msgpack.unpackb(v)
            if len(found) == nranks:
                return [found[r] for r in range(nranks)]
            if time.monotonic() > deadline:
                raise _init_timeout(comm_id, nranks, sorted(found), timeout)
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def _init_timeout(comm_id, nranks, joined, timeout) -> HcclError:
    missing = [r for r in range(nranks) if r not in joined]
    return HcclError(HcclResult.HCCL_E_TIMEOUT,
                     f"comm init '{comm_id}': ranks {missing} never joined within {timeout:g} s "
                     f"(HCCL_CONNECT_TIMEOUT); joined: {joined}")


class HcclService:
    def __init__(self, card, rendezvous=None):
        self.card = card
        self.rendezvous = rendezvous or getattr(card, "rendezvous", None) or LocalRendezvous()
        self.endpoints: dict[str, Endpoint] = {}
        self.ctrl: dict[str, Segment] = {}
        self.released: set[str] = set()         # communicators whose control block this card gave up
        self.retired: list = []                 # (keep until, hub handle) of destroyed communicators
        self.lock = threading.Lock()

    # -- shared memory --------------------------------------------------------------------------
    def ctrl_array(self, comm_id: str, nbytes: int):
        with self.lock:
            if comm_id in self.released:
                raise HcclError(HcclResult.HCCL_E_PARA, f"comm '{comm_id}' was destroyed on {self.card.where}, which "
                                                        f"held its control block")
            seg = self.ctrl.get(comm_id)
            if seg is None:
                seg = self.ctrl[comm_id] = Segment(max(nbytes, 4096), name=f"npusim-hccl-{comm_id}")
                seg.array[:] = 0
            return seg.array

    def peer_ctrl_array(self, card_index: int, comm_id: str, nbytes: int):
        return self.card.peers.ctrl_array(card_index, comm_id, nbytes)

    def segment_array(self, card_index: int, seg: int):
        if card_index == self.card.index:
            return self.card.memory.segment(seg).array
        return self.card.peers.segment(card_index, seg, None)

    @functools.lru_cache(maxsize=256)
    def _schedule(self, op, n, count, root, algo_text, nodes, nbytes, topology, v_key):
        limit = getattr(getattr(self.card, "config", None), "ring_threshold_bytes", 0)
        thresholds = {k: limit for k in ("all_reduce", "all_gather", "reduce_scatter")} if limit else {}
        algo, params = algos.choose(op, n, nbytes, nodes=nodes, topology=topology, hccl_algo=algo_text or None,
                                    thresholds=thresholds)
        kw = dict(params)
        if root is not None:
            kw["root"] = root
        if v_key is not None:
            kw.update(dict(v_key))
        return algos.build(op, algo, n, count, **kw)

    def schedule(self, op: str, n: int, p: dict, nodes: int):
        dt = np_dtype(p["dtype"])
        v_key = None
        if op == "all_to_all_v":
            v_key = tuple((k, tuple(tuple(x) for x in p[k])) for k in ("send_counts", "sdispls", "recv_counts", "rdispls"))
        topology = getattr(getattr(self.card, "config", None), "topology", "fullmesh")
        return self._schedule(op, n, p["count"], p.get("root"), p.get("algo") or "", nodes,
                              p["count"] * dt.itemsize, topology, v_key)

    # -- commands -----------------------------------------------------------------------------------
    def init(self, conn, comm_id: str, nranks: int, rank: int, options: dict) -> dict:
        info = [self.card.node, self.card.index, os.getpid()]
        members = self.rendezvous.join(comm_id, nranks, rank, info, float(options.get("connect_timeout", 120)))
        seen = {}
        for r, m in enumerate(members):
            key = (m[0], m[1])
            if key in seen:
                raise HcclError(HcclResult.HCCL_E_PARA, f"comm init '{comm_id}': ranks {seen[key]} and {r} are both on "
                                                        f"card {m[1]} of node {m[0]} (one rank per card)")
            seen[key] = r
        ep = Endpoint(self, comm_id, nranks, rank, members, options, conn)
        ep.attach()
        with self.lock:
            self.endpoints[(comm_id, rank)] = ep
        return {"members": members}

    def endpoint(self, comm_id: str, rank: int) -> Endpoint:
        ep = self.endpoints.get((comm_id, rank))
        if ep is None:
            raise HcclError(HcclResult.HCCL_E_PARA, f"comm '{comm_id}' rank {rank} does not exist on {self.card.where} "
                                                    f"(destroyed, or never initialized)")
        return ep

    def destroy(self, comm_id: str, rank: int) -> None:
        with self.lock:
            ep = self.endpoints.pop((comm_id, rank), None)
        if ep is not None:
            ep.close(CLOSED)
            self._release_ctrl([comm_id])

    def release_owner(self, conn) -> None:
        with self.lock:
            mine = [k for k, ep in self.endpoints.items() if ep.owner is conn]
            eps = [self.endpoints.pop(k) for k in mine]
        for ep in eps:
            ep.close(HOST_GONE)
        self._release_ctrl([ep.comm_id for ep in eps])

    def retire_hub(self, hub) -> None:
        """Keep a closed endpoint's hub handle for HUB_GRACE seconds more. The card whose endpoint created
        the hub owns it, and Ray ends an actor when its owner drops the last handle — while replies to the
        other ranks' last arrival may still be on their way (seen: "the communicator's hub died" on ranks
        that had all arrived)."""
        now = time.monotonic()
        with self.lock:
            self.retired = [(t, h) for t, h in self.retired if t > now]     # older ones may go now
            self.retired.append((now + HUB_GRACE, hub))

    def _release_ctrl(self, comm_ids) -> None:
        """Drop this card's hold on control blocks no local endpoint uses any more. Other cards and rank
        processes keep their own mappings (the memory lives until the last one goes); a card that asks
        for the block afterwards is refused rather than handed a fresh, empty one."""
        with self.lock:
            done = [c for c in set(comm_ids) if c in self.ctrl and not any(k[0] == c for k in self.endpoints)]
            segs = [self.ctrl.pop(c) for c in done]
            self.released.update(done)
        for seg in segs:
            seg.close()

    def close(self) -> None:
        for key in list(self.endpoints):
            self.destroy(*key)
        for seg in self.ctrl.values():
            seg.close()
        self.ctrl.clear()
        self.retired.clear()
