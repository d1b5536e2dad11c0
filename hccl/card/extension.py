"""HCCL's part of every card, plugged in through the card's extension seam (``rt/card/extension.py``).

Commands ``hccl_init`` (join a communicator: a rendezvous of every rank's card, bounded by
``HCCL_CONNECT_TIMEOUT``, naming the ranks that never joined), ``hccl_ctrl`` (a peer card asks for the
control block this card holds), ``hccl_share`` (the rank's own process maps its node's control block, for
the host path), ``hccl_segment`` (the rank's own process maps a card segment of the node, for large collectives it
runs itself) and ``hccl_destroy``; tasks ``hccl_collective``, ``hccl_finish`` (the rest of a small collective
the host path started), ``hccl_resume`` (the rest of a large one) and ``hccl_p2p`` — each named in the tables
of ``HcclExtension.__init__``, the tasks run by ``collective.py`` and ``p2p.py``. Per card it keeps the
communicator endpoints (``endpoint.py``) and the control blocks it holds; schedules are built once per
signature (``algos.select.for_call``). Environment-controlled behaviour (timeouts,
``HCCL_ALGO``) comes from the *calling process's* environment, sent along with each init.
"""

from __future__ import annotations

import os
import threading
import time

from rt.card.dispatch import DEFERRED, with_fds
from rt.card.extension import Extension
from rt.constants import AclErrorCode
from rt.errors import AclError, NpuError
from rt.wire.segment import Segment

from .. import algos
from ..errors import HcclError
from ..protocol.ctrlblock import CLOSED, HOST_GONE
from ..transport.fabric import for_card
from ..transport.leaders import host_led
from ..types import HcclResult
from . import collective, faults, p2p
from .endpoint import Endpoint

HUB_GRACE = 60.0    # seconds a card keeps a destroyed communicator's hub alive for the slower ranks


class HcclExtension(Extension):
    """HCCL on one card: its commands and tasks (the tables below), communicator endpoints, control blocks."""

    def __init__(self, card):
        super().__init__(card)
        self.commands = {
            "hccl_init": self.c_init,
            "hccl_ctrl": self.c_ctrl,
            "hccl_share": self.c_share,
            "hccl_segment": self.c_segment,
            "hccl_destroy": self.c_destroy,
            "hccl_link_host": self.c_link_host,
        }
        self.tasks = {
            "hccl_collective": self.t_collective,
            "hccl_finish": self.t_finish,
            "hccl_resume": self.t_resume,
            "hccl_p2p": self.t_p2p,
        }
        self.transport = for_card(card)
        self.endpoints: dict[tuple[str, int], Endpoint] = {}
        self.ctrl: dict[str, Segment] = {}
        self.released: set[str] = set()         # communicators whose control block this card gave up
        self.retired: list = []                 # (keep until, hub) of destroyed communicators
        self.lock = threading.Lock()

    # -- commands -----------------------------------------------------------------------------------
    def c_init(self, conn, comm_id, nranks, rank, options, req):
        """Join communicator ``comm_id``; replies once every rank joined (in a thread: it may wait long)."""
        card = self.card

        def run():
            try:
                value = self.join(conn, comm_id, nranks, rank, options)
            except NpuError as e:
                card.reply_later(conn, req, e)
                return
            except Exception as e:  # noqa: BLE001 - reported to the caller, never lost
                card.reply_later(conn, req, AclError(AclErrorCode.ACL_ERROR_RT_INTERNAL_ERROR,
                                                     f"hccl_init: {type(e).__name__}: {e}"))
                return
            card.reply_later(conn, req, None, value)
        threading.Thread(target=run, name=f"hccl-init-{comm_id}", daemon=True).start()
        return DEFERRED

    def c_link_host(self, conn):
        """Where a rank process on this card's node listens for other node leaders (``hccl/transport/leaders.py``):
        the address this card's own links use, or None — cards in one process never span nodes."""
        return self.transport.link_host()

    def c_ctrl(self, conn, comm_id, nbytes):
        self.ctrl_array(comm_id, nbytes)
        seg = self.ctrl[comm_id]
        return with_fds(seg.size, [seg.fd])

    def c_share(self, conn, comm_id, rank):
        """The control block of ``comm_id`` for the rank's own process (``hccl/hostpath.py``): ``nbytes`` plus
        its fd, from this card or fetched from the node's leader card; None if it cannot be shared."""
        ep = self.endpoint(comm_id, rank)
        if ep.leader_card == self.card.index:
            seg = self.ctrl[comm_id]
            return with_fds(seg.size, [seg.fd])
        size, fds = self.card.peers.call(ep.leader_card, "hccl_ctrl", comm_id, ep.ctrl.raw.size, want_fds=True)
        return with_fds(size, fds, close=True)

    def c_segment(self, conn, comm_id, rank, card_index, seg):
        """For the rank's own process running a large collective (``hccl/hostsched.py``): segment ``seg`` of card
        ``card_index`` of this node — this card's own, or relayed from that card (``export_segment``) — as its
        size plus fd; with ``seg`` None, what this card's schedule choice depends on (``schedule_config``)."""
        self.endpoint(comm_id, rank)            # only a member of a live communicator may map card memory
        if seg is None:
            return list(self.schedule_config())
        if card_index == self.card.index:
            segment = self.card.memory.segment(seg)
            return with_fds(segment.size, [segment.fd])
        size, fds = self.card.peers.call(card_index, "export_segment", seg, want_fds=True)
        return with_fds(size, fds, close=True)

    def c_destroy(self, conn, comm_id, rank):
        with self.lock:
            ep = self.endpoints.pop((comm_id, rank), None)
        if ep is not None:
            ep.close(CLOSED)
            self._release_ctrl([comm_id])

    def t_collective(self, conn, stream, comm_id, rank, seq, op, params, buffers):
        """A collective: resolve this rank's buffers now (program order), run it when the stream gets here."""
        ep = self.endpoint(comm_id, rank)
        views = self._views(buffers, op)
        if "fault" in params:           # NPUSIM_FAULTS fail / corrupt (hccl/card/faults.py)
            return faults.injected(self, lambda: collective.run(ep, seq, op, params, views), params["fault"],
                                   f"{op} #{seq} on comm '{comm_id}' (rank {rank})", [views.get("recv")])
        return lambda: collective.run(ep, seq, op, params, views)

    def t_finish(self, conn, stream, comm_id, rank, seq, op, params, buffers, target, phase=1):
        """The rest of a small collective the host started (staged its input, arrived; with ``phase`` 2 also
        reduced its block of a split all_reduce and arrived again) and handed over."""
        ep = self.endpoint(comm_id, rank)
        views = self._views(buffers, op)
        return lambda: collective.staged_finish(ep, seq, op, params, views, target, phase)

    def t_resume(self, conn, stream, comm_id, rank, seq, op, params, buffers, target, start, checked):
        """The rest of a large collective the host started and handed over at barrier phase ``target``, before
        step ``start`` (``collective.resume``)."""
        ep = self.endpoint(comm_id, rank)
        views = self._views(buffers, op)
        return lambda: collective.resume(ep, seq, op, params, views, target, start, checked)

    def t_p2p(self, conn, stream, comm_id, rank, items, fault=None):
        """send/recv/batch_send_recv: items are [kind, peer, ptr, count, dtype, nbytes]; ``fault``: NPUSIM_FAULTS
        fail / corrupt (hccl/card/faults.py)."""
        ep = self.endpoint(comm_id, rank)
        resolved = []
        for kind, peer, ptr, count, dtype, nbytes in items:
            seg, off = self.card.memory.locate(ptr, nbytes, what=f"{kind} buffer")
            resolved.append((kind, peer, (seg, off, nbytes), count, dtype))

        def run():
            for kind, peer, view, count, dtype in resolved:     # sends first: never deadlock a batch
                if kind == "send":
                    p2p.post_send(ep, peer, view, count, dtype)
            for kind, peer, view, count, dtype in resolved:
                if kind == "recv":
                    p2p.recv(ep, peer, view, count, dtype)
            for kind, peer, view, count, dtype in resolved:
                if kind == "send":
                    p2p.wait_send(ep, peer)
        if fault is not None:
            kind, peer = resolved[0][0], resolved[0][1]      # named as the endpoint names its p2p failures
            what = (lambda: f"recv #{ep.p2p_seq.get((peer, rank), 0)} on rank {rank} from rank {peer} on comm "
                            f"'{comm_id}'") if kind == "recv" else \
                   (lambda: f"send #{ep.p2p_seq.get((rank, peer), 0)} from rank {rank} to rank {peer} on comm "
                            f"'{comm_id}'")
            return faults.injected(self, run, fault, what, [view for k, _, view, _, _ in resolved if k == "recv"])
        return run

    def _views(self, buffers: dict, op: str) -> dict:
        views = {}
        for name, (ptr, nbytes) in buffers.items():
            seg, off = self.card.memory.locate(ptr, nbytes, what=f"{op} {name} buffer")
            views[name] = (seg, off, nbytes)
        return views

    # -- communicators -----------------------------------------------------------------------------
    def join(self, conn, comm_id: str, nranks: int, rank: int, options: dict) -> dict:
        card = self.card
        info = [card.node, card.index, os.getpid(), options.get("host_link")]
        infos = self.transport.rendezvous(comm_id, nranks, rank, info, float(options.get("connect_timeout", 120)))
        members, host_links = [m[:3] for m in infos], [m[3] for m in infos]
        seen = {}
        for r, m in enumerate(members):
            key = (m[0], m[1])
            if key in seen:
                raise HcclError(HcclResult.HCCL_E_PARA, f"comm init '{comm_id}': ranks {seen[key]} and {r} are both on "
                                                        f"card {m[1]} of node {m[0]} (one rank per card)")
            seen[key] = r
        ep = Endpoint(self, comm_id, nranks, rank, members, options, conn)
        ep.host_leads = host_led(members, host_links)
        ep.attach()
        with self.lock:
            self.endpoints[(comm_id, rank)] = ep
        return {"members": members, "host_links": host_links}

    def endpoint(self, comm_id: str, rank: int) -> Endpoint:
        ep = self.endpoints.get((comm_id, rank))
        if ep is None:
            raise HcclError(HcclResult.HCCL_E_PARA, f"comm '{comm_id}' rank {rank} does not exist on "
                                                    f"{self.card.where} (destroyed, or never initialized)")
        return ep

    def release_owner(self, conn) -> None:
        with self.lock:
            mine = [k for k, ep in self.endpoints.items() if ep.owner is conn]
            eps = [self.endpoints.pop(k) for k in mine]
        for ep in eps:
            ep.close(HOST_GONE)
        self._release_ctrl([ep.comm_id for ep in eps])

    def retire_hub(self, hub) -> None:
        """Keep a closed endpoint's hub for HUB_GRACE seconds more: the hub of the ranks in this process
        (``hccl/transport/direct.py``) lives while an endpoint holds it, and other ranks' last round may still be
        finishing when one rank destroys the communicator."""
        now = time.monotonic()
        with self.lock:
            self.retired = [(t, h) for t, h in self.retired if t > now]     # older ones may go now
            self.retired.append((now + HUB_GRACE, hub))

    def close(self) -> None:
        for comm_id, rank in list(self.endpoints):
            self.c_destroy(None, comm_id, rank)
        for seg in self.ctrl.values():
            seg.close()
        self.ctrl.clear()
        self.retired.clear()

    # -- shared memory --------------------------------------------------------------------------------
    def ctrl_array(self, comm_id: str, nbytes: int):
        """The control block of ``comm_id`` this card holds (created zeroed on first request)."""
        with self.lock:
            if comm_id in self.released:
                raise HcclError(HcclResult.HCCL_E_PARA, f"comm '{comm_id}' was destroyed on {self.card.where}, which "
                                                        f"held its control block")
            seg = self.ctrl.get(comm_id)
            if seg is None:
                # a fresh memfd reads as zeros; its pages (mostly staging areas a communicator spanning nodes
                # never uses) are allocated when first written, not up front: 256 ranks' blocks are 134 MB each
                seg = self.ctrl[comm_id] = Segment(max(nbytes, 4096), name=f"npusim-hccl-{comm_id}", prefault=False)
            return seg.array

    def peer_ctrl_array(self, card_index: int, comm_id: str, nbytes: int):
        return self.card.peers.map(card_index, "hccl_ctrl", comm_id, nbytes)

    def segment_array(self, card_index: int, seg: int):
        if card_index == self.card.index:
            return self.card.memory.segment(seg).array
        return self.card.peers.segment(card_index, seg)

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

    # -- schedules ------------------------------------------------------------------------------------
    def schedule(self, op: str, n: int, p: dict, nodes: int):
        """The schedule of collective ``op`` (any but all_to_all_v, which has none: ``collective.py``) on ``n``
        ranks over ``nodes`` nodes, chosen and built once per signature (``algos.select.for_call``)."""
        return algos.select.for_call(op, n, p, nodes, *self.schedule_config())

    def schedule_config(self) -> tuple[str, int]:
        """What this card's schedule choice depends on besides the call: its node's topology and the config's
        ``ring_threshold_bytes``."""
        config = self.card.config
        return getattr(config, "topology", "fullmesh"), getattr(config, "ring_threshold_bytes", 0)
