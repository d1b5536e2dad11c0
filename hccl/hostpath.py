"""Small collectives run by the rank's own process when its stream is idle: no round trip to the card.

A small collective (≤ 256 KiB per rank) on one node is one barrier over the communicator's control block:
stage the input, arrive, wait, compute from every rank's stage (``hccl/protocol/staged.py``). When the stream
it is enqueued on has finished everything this process put on it (the card publishes per-stream
progress in a shared page, ``rt.wire.client.CardClient.stream_done``), doing that here is indistinguishable
from the card doing it — same bytes read and written, same order — and costs one process instead of
three thread hand-offs in two. Ranks on the host path and ranks on the card path interoperate: they
follow the same protocol on the same control block.

The call returns once the collective is done, so a rank waits for its peers inside the call. That wait
is short and bounded (``NPUSIM_HCCL_HOST_WAIT_MS``, default 20): if the peers have not all arrived by
then, the rest (wait, check, compute) is handed to the card as a stream task, so a peer that first
needs something this rank enqueues later is never blocked by it. Any irregularity — calls that do not
match, a peer that is gone — is also handed over, and the card reports it at the next synchronize,
exactly as on the card path. ``NPUSIM_HCCL_HOST_PATH=0`` turns the host path off.

A call costs one pass of Python over prepared state: per call signature (``handle.Call``) the views of its
buffers, its stage areas and its fingerprint bytes are computed once (``Prepared``; views again only when the
context forgot an allocation), a reduction is one ufunc call over every rank's stage, the phase wakes its
sleepers once, and a waiter yields its core before it sleeps only while that pays (``protocol/ctrlblock.py``).

Across nodes a rank follows the node-staged protocol instead (``protocol/nodestaged.py``: ``HostNode``): it
stages in its node's control block and takes its result from there; its node's leader rank's process leads the
round across nodes (``HostLead``, over direct connections between the leaders' processes:
``transport/leaders.py``) when every node's leader can, else the leader hands the round to its card. Only communicators with one rank in this process use it (a process driving several ranks from one
thread, as ``comm_init_all`` does, must never block in one rank's call), and only buffers this process
allocated itself (``rt.host.hostview.DeviceMap``); everything else goes to the card. Collectives too large
for the stages run here on the same conditions, as the card's schedule (``hostsched.py``).
"""

from __future__ import annotations

import os
import threading

import numpy as np

from rt.errors import NpuError
from rt.wire.segment import close_fds, map_received

from . import hostsched
from .transport import leaders
from .errors import HcclError
from .protocol.ctrlblock import ARRIVED, DONE, SLOT_WORDS, SPINNER, ControlBlock, WaitAbort, wait_until
from .protocol.nodestaged import HostLead, HostNode, result_bytes
from .protocol.staged import (fast_reduce, fast_split, fits_stage, split_gather, split_own, split_reduce, stage_out,
                              stage_source)
from .types import HcclResult

_local_ranks: dict[str, int] = {}      # communicator id -> ranks of it in this process
_lock = threading.Lock()


def joined(comm_id: str) -> None:
    with _lock:
        _local_ranks[comm_id] = _local_ranks.get(comm_id, 0) + 1


def left(comm_id: str) -> None:
    with _lock:
        if _local_ranks.get(comm_id, 0) > 0:
            _local_ranks[comm_id] -= 1


def _wait_ms() -> float:
    text = os.environ.get("NPUSIM_HCCL_HOST_WAIT_MS", "20")
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise HcclError(HcclResult.HCCL_E_PARA, f"NPUSIM_HCCL_HOST_WAIT_MS={text!r} must be a number of "
                                                f"milliseconds >= 0")
    return value


def enabled() -> bool:
    return os.environ.get("NPUSIM_HCCL_HOST_PATH", "1").lower() not in ("0", "false", "no", "off")


def control_block(comm) -> ControlBlock | None:
    """The control block of ``comm`` on this rank's node, mapped into this process (None: it cannot be)."""
    try:
        reply, fds = comm.ctx.client.call("hccl_share", comm.id, comm.rank, want_fds=True)
    except NpuError:
        return None
    if reply is None:
        close_fds(fds)
        return None
    try:
        arr = map_received(fds, reply)
    except OSError:
        return None
    if arr.size < ControlBlock.nbytes(comm.size):
        return None
    return ControlBlock(arr, comm.size)


_link_hosts: dict = {}                 # node -> the address its cards' links listen on (None: no links)


def host_link(ctx) -> list | None:
    """Where this process listens for the leaders of other nodes (``hccl/transport/leaders.py``), published at
    comm init by a rank that may lead its node's rounds; None when it may not (host path off, cards that live
    in one process)."""
    if not enabled():
        return None
    if ctx.node not in _link_hosts:
        try:
            _link_hosts[ctx.node] = ctx.client.call("hccl_link_host")
        except NpuError:
            return None
    host = _link_hosts[ctx.node]
    return None if host is None else leaders.listener(host).address


def start_lead(comm, host_links) -> HostLead | None:
    """The thread that leads this rank's node across nodes (``HostLead``) when ``comm`` is host-led and this rank
    is its node's leader (its lowest rank); else None."""
    if not host_links or not leaders.host_led(comm.members, host_links):
        return None
    by_node: dict = {}
    for r, m in enumerate(comm.members):
        by_node.setdefault(m[0], []).append(r)
    groups = sorted(by_node.values(), key=min)
    if comm.rank not in [g[0] for g in groups]:
        return None
    ctrl = control_block(comm)
    if ctrl is None:
        raise HcclError(HcclResult.HCCL_E_INTERNAL, f"comm init '{comm.id}': rank {comm.rank} leads its node's "
                                                    f"exchange but cannot map the node's control block")
    index = [g[0] for g in groups].index(comm.rank)
    link = leaders.LeaderLink(comm.id, index, groups, [host_links[g[0]] for g in groups],
                              [m[0] for m in comm.members])
    return HostLead(comm, ctrl, link)


def _copy_pair(dst: np.ndarray, src: np.ndarray) -> tuple:
    """``(dst, src)`` such that ``dst[:] = src`` copies ``src`` into ``dst``: as byte memoryviews (one memcpy, none of
    numpy's dispatch) when both are contiguous, else the arrays themselves."""
    if dst.flags.c_contiguous and src.flags.c_contiguous:
        return memoryview(dst).cast("B"), memoryview(src).cast("B")
    return dst, src


class Prepared:
    """What the host path computes once per call signature (``handle.Call``): the views of the call's buffers
    (valid while the context forgets no allocation), the stage areas it writes and reads, and the
    length-prefixed fingerprint bytes it publishes."""

    large = False                       # a small collective (``hostsched.LargePrepared``: a large one)

    def __init__(self, path: HostPath, call):
        ctrl, rank, op, p = path.ctrl, path.comm.rank, call.op, call.params
        self.op, self.params = op, p
        self.source = stage_source(op, p, rank)
        # where this rank's fingerprint goes, its bytes, every rank's area and what it holds when all called this
        areas, data, self.fp_all, self.fp_agreed = ctrl.fingerprint_setup(rank, p["fingerprint"])
        self.fp_area, self.fp_bytes = [memoryview(a) for a in areas], memoryview(data)    # assigned: one memcpy
        self.order = call.stream.ctx.client.stream_order(call.stream.id)     # its stream's order lock
        self.generation = -1            # of the device map when ``views`` were taken
        self.views: dict = {}
        self.ctrl_stage = [ctrl.stage(rank, parity) for parity in (0, 1)]
        self.ctrl_results = ctrl.results
        self.stage_in: list = []        # per parity: (this rank's stage, its input), or None
        self.reduce = fast_reduce(ctrl, rank, op, p)
        self.reduce_out = None          # the typed view of "recv" the reduction writes (with ``views``)
        self.split = None               # a split all_reduce: (own block, the others' blocks), by (parity, recv)
        # across nodes: the bytes of the node's result this rank copies whole into "recv" (``take_result``'s common
        # case; -1: another case, or no copy: a broadcast's root), and per parity that copy's (dst, src) pair
        self.take_len = -1 if path.node is None else result_bytes(op, p, ctrl.n, rank)
        self.take: list = [None, None]
        if split_reduce(op, p, ctrl.n):
            self.split = fast_split(ctrl, rank, p) or (
                lambda parity, recv: split_own(lambda k: ctrl.stage(k, parity), ctrl.n, rank, p, recv),
                lambda parity, recv: split_gather(lambda k: ctrl.stage(k, parity), ctrl.n, rank, p, recv))

    def publish(self, parity: int) -> None:
        """This rank's part of the call before it arrives: its input staged (if it stages one), its fingerprint."""
        staged = self.stage_in[parity]
        if staged is not None:
            staged[0][:] = staged[1]
        self.fp_area[parity][:] = self.fp_bytes

    def refresh(self, devmap, buffers) -> bool:
        """Take the buffers' views again (the device map forgot an allocation since); False: not all are ours."""
        views = {}
        for name, buf in buffers.items():
            if buf is not None and buf[1]:
                views[name] = devmap.view(buf[0], buf[1])
                if views[name] is None:
                    return False
        self.views = views
        recv = views.get("recv")
        try:
            self.reduce_out = None if recv is None or self.reduce is None else recv.view(self.reduce.dtype)
        except ValueError:              # a size the dtype does not divide: prep.reduce raises, the card says why
            self.reduce_out = None
        if self.take_len > 0 and recv is not None and recv.size >= self.take_len:
            self.take = [_copy_pair(recv[:self.take_len], self.ctrl_results[parity][:self.take_len])
                         for parity in (0, 1)]
        data = views.get(self.source) if self.source else None
        self.stage_in = [None, None] if data is None else \
            [_copy_pair(self.ctrl_stage[parity][:data.size], data) for parity in (0, 1)]
        return True


class HostPath:
    """The host path of one rank of one communicator (built on its first eligible call)."""

    def __init__(self, comm, ctrl: ControlBlock):
        self.comm = comm
        self.ctrl = ctrl
        self.wait = _wait_ms() / 1000
        self.devmap = comm.ctx.devmap
        self.done = 0                   # collectives completed in this process
        self.handed = 0                 # started here, finished by the card
        self.handed_task = None         # the stream task the last call's rest went to (None: done here)
        self.node = None                # across nodes: its part of the node-staged protocol (``HostNode``)
        self.sched_config = None        # the card's schedule inputs, for large collectives (hostsched.py)
        self.segments: dict = {}        # (card, segment) -> peers' card memory mapped here (hostsched.py)

    @classmethod
    def build(cls, comm) -> HostPath | None:
        """The host path for ``comm``, or None when it must not or cannot have one."""
        if not enabled() or _local_ranks.get(comm.id, 0) != 1:
            return None
        ctrl = comm.lead.ctrl if comm.lead is not None else control_block(comm)
        if ctrl is None:
            return None
        path = cls(comm, ctrl)
        if len({m[0] for m in comm.members}) != 1:          # across nodes: the node-staged protocol
            path.node = HostNode(comm, path.wait, ctrl)
        return path

    def prepare(self, call):
        """What this call signature needs here (``Prepared``; too large for the stages on one node:
        ``hostsched.LargePrepared``), or None: it never runs on the host path."""
        if not fits_stage(call.op, call.params, self.comm.size, across_nodes=self.node is not None):
            return None if self.node is not None else hostsched.prepare(self, call)
        return Prepared(self, call)

    def run(self, stream, seq: int, call, params: dict) -> bool:
        """Run collective ``seq`` (a call of signature ``call``; ``params`` as sent) here if possible; False
        (nothing done) means: submit it to the card.

        The hot path of a small collective: with 8 ranks on 2 cores every call runs with cold caches, and each
        Python call on its way costs 1-3 % of it (docs/performance.md), so the single-node staged protocol is
        written out here rather than spread over helpers (``HostNode.run`` does the same for the protocol across
        nodes; ``arrive``, ``Prepared.publish`` and ``_wait`` serve the large collectives of ``hostsched``)."""
        self.handed_task = None
        prep = call.host
        if prep is False:
            prep = call.host = self.prepare(call)
        if prep is None:
            return False
        devmap = self.devmap
        devmap.enter()
        try:
            if prep.generation != devmap.generation:
                generation = devmap.generation
                try:
                    if not prep.refresh(devmap, call.buffers):
                        return False
                except NpuError:        # the card is gone or refused: its own path reports why
                    return False
                prep.generation = generation
            if self.node is not None:
                return self.node.run(self, stream, seq, prep, call, params)
            if prep.large:
                return hostsched.run(self, stream, seq, prep, call, params)
            ctrl, rank = self.ctrl, self.comm.rank
            words, slot = ctrl.words, rank * SLOT_WORDS
            client = stream.ctx.client
            with prep.order:
                # Start it here only if nothing before it on the stream, and no earlier collective of this
                # communicator (possibly on another stream), is still with the card: it may be touching this
                # rank's slot. Then publish (input staged, fingerprint), set ARRIVED, arrive at the barrier.
                if not client.stream_done(stream.id) or words[slot + DONE] != seq - 1:
                    return False
                parity = seq & 1
                staged = prep.stage_in[parity]
                if staged is not None:
                    staged[0][:] = staged[1]
                prep.fp_area[parity][:] = prep.fp_bytes
                words[slot + ARRIVED] = seq
                target = ctrl.arrive(rank)
                phases = ctrl.phase_words
                if not (SPINNER.spin_phase(phases, target) or self._sleep(phases, target)):     # self._wait
                    return self._hand_over(client, stream, seq, call, params, target)
                if prep.fp_all[parity].tobytes() != prep.fp_agreed:
                    return self._hand_over(client, stream, seq, call, params, target)
                recv = prep.views.get("recv")
                try:
                    if prep.split is not None:
                        prep.split[0](parity, recv)
                    elif prep.reduce is not None:
                        out = prep.reduce_out
                        if out is not None:         # prep.reduce(parity, recv), written out
                            reduce = prep.reduce
                            reduce.combine(reduce.stages[parity], axis=0, out=out)
                        else:
                            prep.reduce(parity, recv)
                    else:
                        stage_out(ctrl, rank, seq, prep.op, prep.params, recv)
                except Exception:          # the card computes it again and reports what went wrong
                    return self._hand_over(client, stream, seq, call, params, target)
                if prep.split is not None:     # the second phase: every other rank's reduced block
                    target = ctrl.arrive(rank)
                    if not self._wait(phases, target):
                        return self._hand_over(client, stream, seq, call, params, target, 2)
                    try:
                        prep.split[1](parity, recv)
                    except Exception:
                        return self._hand_over(client, stream, seq, call, params, target, 2)
                words[slot + DONE] = seq
            self.done += 1
            return True
        finally:
            devmap.leave()

    def arrive(self, client, stream, seq: int, prep) -> int | None:
        """Start collective ``seq`` here, with the stream's order lock held: None if it cannot — something before
        it on the stream or an earlier collective of this communicator (possibly on another stream) is not done,
        so the card may still be touching this rank's slot — else the call published (``prep.publish``), ARRIVED
        set and this rank's arrival at the barrier of all ranks: the phase to wait for."""
        ctrl, rank = self.ctrl, self.comm.rank
        words, slot = ctrl.words, rank * SLOT_WORDS
        if not client.stream_done(stream.id) or words[slot + DONE] != seq - 1:
            return None
        prep.publish(seq & 1)
        words[slot + ARRIVED] = seq
        return ctrl.arrive(rank)

    def _wait(self, phases, target) -> bool:
        """Wait (at most the host wait) until every rank reached barrier phase ``target``; False: they did not.
        It yields the core first while that pays (``Spinner``, as ``wait_until`` does), then :meth:`_sleep`."""
        return SPINNER.spin_phase(phases, target) or self._sleep(phases, target)

    def _sleep(self, phases, target) -> bool:
        """:meth:`_wait` once yielding stopped paying: sleep on the block's futex, at most the host wait."""
        ctrl, rank = self.ctrl, self.comm.rank
        try:
            wait_until(lambda: min(phases) >= target, timeout=self.wait, spin=False,
                       sleeper=lambda cond, seconds: ctrl.sleep(rank, cond, min(seconds, self.wait)))
        except WaitAbort:
            return False
        return True

    def _hand_over(self, client, stream, seq, call, params, target, phase=1) -> bool:
        """The card finishes it (the stream's order lock is held, so it is the stream's next task); ``phase`` 2:
        from the second barrier of a split all_reduce."""
        self.handed_task = client.submit(stream.id, "hccl_finish", self.comm.id, self.comm.rank, seq, call.op, params,
                                         call.wire, target, phase)
        self.handed += 1
        return True
