"""A collective on a card: the stream task that runs one rank's part of it over peer card memory.

The task (1) publishes its fingerprint and buffers in the communicator's control block
(``hccl/protocol/ctrlblock.py``), (2) waits for every rank to arrive — checking fingerprints, peer
liveness and ``HCCL_EXEC_TIMEOUT`` — and (3) runs this rank's part of the schedule (``hccl/algos``)
step by step, pulling from peer card memory with a barrier between steps. all_to_all_v has no
schedule: its counts are exchanged through the control block and each rank pulls its blocks directly
(one step). Small collectives take the staged path instead (``hccl/protocol/staged.py``: one barrier);
across nodes the arrival (and a small collective whole) is node-staged (``hccl/protocol/nodestaged.py``: one
round per node through its leader card) and step data crosses nodes through the transport's hub.
"""

from __future__ import annotations

import time

import numpy as np

from rt.card.queues import annotate, current_note

from ..algos.steps import run_step
from ..errors import HcclError, who_called
from ..protocol import nodestaged
from ..protocol.ctrlblock import ARRIVED, BUF0, CARD, DONE, V_RCOUNT, V_SCOUNT, V_SDISPL, gave_up
from ..protocol.staged import (fits_stage, split_gather, split_own, split_reduce, stage_agrees, stage_in, stage_out,
                               stage_source)
from ..types import HcclResult, hccl_np_dtype
from .endpoint import Endpoint


def run(ep: Endpoint, seq: int, op: str, p: dict, views: dict) -> None:
    """Run collective ``op`` #seq on endpoint ``ep``; ``views`` are its rank's buffers as (seg, off, nbytes)."""
    what = f"{op} #{seq} on comm '{ep.comm_id}' (rank {ep.rank})"
    ctrl = ep.ctrl
    dtype = hccl_np_dtype(p["dtype"])
    if fits_stage(op, p, ep.n, across_nodes=ep.hub is not None):
        annotate(comm=ep.comm_id, seq=seq, op=op, algo="staged")
        if ep.hub is None:
            return _staged(ep, seq, op, p, views)
        return _hub_staged(ep, seq, op, p, views, what)
    sched = None
    if op != "all_to_all_v":
        sched = ep.service.schedule(op, ep.n, p, ep.nodes)
        annotate(comm=ep.comm_id, seq=seq, op=op, algo=sched.algo, steps=[])
        if sched.tmp_count:
            views = dict(views, tmp=ep.scratch(sched.tmp_count * dtype.itemsize))
    publish(ctrl, ep.rank, seq, op, p, views)
    if ep.hub is not None:
        # every rank (all nodes) has called collective seq (or it raises, naming who called what)
        nodestaged.arrive(ep, seq, what)
        fps = [p["fingerprint"]]
    else:
        ep.barrier(what, seq)                # everyone has published seq
        fps = [ctrl.fingerprint(r, seq) for r in range(ep.n)]
    _after_arrival(ep, seq, op, p, sched, fps, 0, what)


def publish(ctrl, rank: int, seq: int, op: str, p: dict, views: dict) -> None:
    """Rank's arrival at collective ``seq``: its fingerprint, its buffers (seg, off, nbytes), all_to_all_v's
    counts, then ARRIVED. The card's and the host's (``hccl/hostsched.py``) large collectives start alike."""
    me = ctrl.slots[rank]
    ctrl.set_fingerprint(rank, seq, p["fingerprint"])
    for i, name in enumerate(("send", "recv", "tmp")):
        seg = views.get(name)
        me[BUF0 + 3 * i: BUF0 + 3 * i + 3] = seg if seg is not None else (-1, 0, 0)
    if op == "all_to_all_v":
        for peer in range(ctrl.n):
            ctrl.pairs[rank, peer, V_SCOUNT] = p["send_counts"][peer]
            ctrl.pairs[rank, peer, V_SDISPL] = p["sdispls"][peer]
            ctrl.pairs[peer, rank, V_RCOUNT] = p["recv_counts"][peer]
    me[ARRIVED] = seq


def resume(ep: Endpoint, seq: int, op: str, p: dict, views: dict, target: int, start: int, checked: bool) -> None:
    """The rest of a large collective the rank's own process started (``hccl/hostsched.py``) and handed over:
    it published ``seq`` and ran the steps before ``start``, each ending with its arrival at barrier phase
    ``target`` (the first one: the arrival). Wait for that phase, check the calls agree unless ``checked``,
    run the steps from ``start`` on — from there exactly as :func:`run`."""
    what = f"{op} #{seq} on comm '{ep.comm_id}' (rank {ep.rank})"
    sched = ep.service.schedule(op, ep.n, p, ep.nodes)
    annotate(comm=ep.comm_id, seq=seq, op=op, algo=f"{sched.algo} (host handover at step {start})", steps=[])
    ep.wait_phase(what, seq, target)
    fps = None if checked else [ep.ctrl.fingerprint(r, seq) for r in range(ep.n)]
    _after_arrival(ep, seq, op, p, sched, fps, start, what)


def _after_arrival(ep: Endpoint, seq: int, op: str, p: dict, sched, fps, start: int, what: str) -> None:
    """Every rank arrived (``fps``: what each called; None: already checked): check the calls agree, run the
    steps from ``start`` on with a barrier after each, DONE."""
    ctrl, me = ep.ctrl, ep.ctrl.slots[ep.rank]
    problem = None
    if fps is None:
        pass
    elif (late := gave_up(fps)):              # nobody waits at a barrier for this rank any more
        me[DONE] = seq
        raise HcclError(HcclResult.HCCL_E_TIMEOUT, f"{what}: {late}")
    elif len(set(fps)) > 1:
        problem = f"ranks called different collectives: {_group(fps)}"
    elif op == "all_to_all_v" and ep.hub is not None:     # every rank is here: all refuse alike
        me[DONE] = seq
        raise HcclError(HcclResult.HCCL_E_NOT_SUPPORT, f"{what}: all_to_all_v across nodes is not supported")
    elif op == "all_to_all_v":
        bad = [(i, j, int(ctrl.pairs[i, j, V_SCOUNT]), int(ctrl.pairs[i, j, V_RCOUNT]))
               for i in range(ep.n) for j in range(ep.n)
               if ctrl.pairs[i, j, V_SCOUNT] != ctrl.pairs[i, j, V_RCOUNT]]
        if bad:
            problem = "send and recv counts disagree: " + "; ".join(
                f"rank {i} sends {a} elements to rank {j}, which expects {b}" for i, j, a, b in bad[:8])
    if problem:
        if ep.hub is None:                   # nobody overwrites its slot before all have read it
            ep.barrier(what, seq)            # (across nodes the hub holds the fingerprints: no barrier,
        me[DONE] = seq                       # as in _hub_staged, whichever path each rank took)
        raise HcclError(HcclResult.HCCL_E_PARA, f"collective #{seq} on comm '{ep.comm_id}': {problem}")
    dtype = hccl_np_dtype(p["dtype"])
    here = ep.members[ep.rank][0]
    arrays = {r: _rank_arrays(ep, r, dtype) if ep.members[r][0] == here or r == ep.rank else None
              for r in range(ep.n)}
    for r in range(ep.n):                     # remote ranks: only their own sends are read, sent to us
        if arrays[r] is None:
            arrays[r] = _RemoteArrays()
    if sched is None:
        _all_to_all_v(ep, arrays, p)
        ep.barrier(what, seq)
    else:
        rop = p.get("op", 0)
        step_ends = current_note().get("steps", [])
        for si in range(start, len(sched.steps)):
            full_step = sched.steps[si]
            fetched = _remote_step(ep, si, seq, full_step, arrays, what) if ep.hub is not None else None
            run_step(sched, si, ep.rank, arrays, rop, fetched)
            ep.barrier(what, seq)
            step_ends.append(time.monotonic_ns())
        if not sched.steps:
            ep.barrier(what, seq)
    me[DONE] = seq


def staged_finish(ep: Endpoint, seq: int, op: str, p: dict, views: dict, target: int, phase: int = 1) -> None:
    """Wait for every rank to have staged ``seq`` (barrier phase ``target``), check the calls agree,
    compute this rank's result — a split all_reduce (``split_reduce``) in two phases, its own block then the
    others'. Also runs collectives the host process started and handed over (``phase`` 2: the host already
    reduced its block and arrived at the second barrier, ``target``); across nodes the node-staged protocol's
    rest (``hccl/protocol/nodestaged.py``)."""
    what = f"{op} #{seq} on comm '{ep.comm_id}' (rank {ep.rank})"
    if "algo" not in current_note():
        annotate(comm=ep.comm_id, seq=seq, op=op, algo="staged (host handover)")
    recv = views.get("recv")
    out = ep.view(recv) if recv is not None and recv[2] else None
    if ep.hub is not None:
        return nodestaged.finish(ep, seq, op, p, out, target, what)
    ctrl, me, n = ep.ctrl, ep.ctrl.slots[ep.rank], ep.n
    parity = seq % 2
    if phase == 1:
        ep.wait_phase(what, seq, target)
        if not stage_agrees(ctrl, seq):
            fps = [ctrl.fingerprint(k, seq) for k in range(n)]
            late = gave_up(fps)
            if late:                         # nobody waits at a barrier for this rank any more
                me[DONE] = seq
                raise HcclError(HcclResult.HCCL_E_TIMEOUT, f"{what}: {late}")
            ep.barrier(what, seq)
            me[DONE] = seq
            raise HcclError(HcclResult.HCCL_E_PARA, f"collective #{seq} on comm '{ep.comm_id}': ranks called "
                                                    f"different collectives: {_group(fps)}")
        if not split_reduce(op, p, n):
            stage_out(ctrl, ep.rank, seq, op, p, out)
            me[DONE] = seq
            return
        if out is not None:
            split_own(lambda k: ctrl.stage(k, parity), n, ep.rank, p, out)
        target = ctrl.arrive(ep.rank)
    ep.wait_phase(what, seq, target)
    if out is not None:
        split_gather(lambda k: ctrl.stage(k, parity), n, ep.rank, p, out)
    me[DONE] = seq


def _staged(ep: Endpoint, seq: int, op: str, p: dict, views: dict) -> None:
    """Small collectives in one barrier: every rank copies its input into its staging area (double-
    buffered by sequence parity), waits once, then computes its own result from all the stages.

    A rank writes stage ``seq % 2`` again only at ``seq + 2``, after the barrier of ``seq + 1``, which
    nobody passes before every rank has finished reading ``seq``: no second barrier is needed.
    """
    source = stage_source(op, p, ep.rank)
    view = views.get(source) if source else None
    data = ep.view(view) if view is not None and view[2] else None
    target = stage_in(ep.ctrl, ep.rank, seq, p["fingerprint"], data)
    staged_finish(ep, seq, op, p, views, target)


def _hub_staged(ep: Endpoint, seq: int, op: str, p: dict, views: dict, what: str) -> None:
    """A small collective across nodes, node-staged (``hccl/protocol/nodestaged.py``): this rank stages its input
    in the node's control block and arrives; its node's leader card runs one round across nodes for the node."""
    source = stage_source(op, p, ep.rank)
    view = views.get(source) if source else None
    data = ep.view(view) if view is not None and view[2] else None
    ctrl = ep.ctrl
    if data is not None:
        ctrl.stage(ep.rank, seq % 2)[:data.size] = data
    ctrl.set_fingerprint(ep.rank, seq, p["fingerprint"])
    ctrl.slots[ep.rank, ARRIVED] = seq
    target = ctrl.arrive(ep.rank, ep.local, round_=True)
    recv = views.get("recv")
    nodestaged.finish(ep, seq, op, p, ep.view(recv) if recv is not None and recv[2] else None, target, what)


def _remote_step(ep: Endpoint, step_index: int, seq: int, step, arrays, what: str) -> dict:
    """Inter-node transfers of one step: leave what remote ranks pull from us, fetch what we pull."""
    node_of = [m[0] for m in ep.members]
    here = node_of[ep.rank]
    for i, t in enumerate(step):
        if t.src == ep.rank and node_of[t.dst] != here and t.count:
            ep.hub.send((seq, step_index, i), arrays[t.src][t.src_buf][t.src_off: t.src_off + t.count], t.dst)
    fetched = {}
    for i, t in enumerate(step):
        if t.dst == ep.rank and node_of[t.src] != here and t.count:
            fetched[i] = ep.hub.recv((seq, step_index, i), what, seq, ep.exec_timeout, t.src)
    return fetched


def _all_to_all_v(ep: Endpoint, arrays, p) -> None:
    """This rank's part of all_to_all_v: from every rank, the block it sends here (count and offset as that
    rank published them) into this rank's recv at its own rdispls."""
    recv, pairs = arrays[ep.rank]["recv"], ep.ctrl.pairs
    for src in range(ep.n):
        count = int(pairs[src, ep.rank, V_SCOUNT])
        if count:
            off = int(pairs[src, ep.rank, V_SDISPL])
            rd = p["rdispls"][src]
            np.copyto(recv[rd: rd + count], arrays[src]["send"][off: off + count])


def _rank_arrays(ep: Endpoint, r: int, dtype) -> dict:
    """Rank ``r``'s send/recv/tmp buffers as it published them, typed views of its card's memory."""
    slot = ep.ctrl.slots[r]
    out = {}
    card = int(slot[CARD])
    for i, name in enumerate(("send", "recv", "tmp")):
        seg, off, nbytes = (int(x) for x in slot[BUF0 + 3 * i: BUF0 + 3 * i + 3])
        if seg < 0:
            out[name] = np.empty(0, dtype)
            continue
        base = ep.service.segment_array(card, seg)
        out[name] = base[off: off + nbytes].view(dtype)
    return out


class _RemoteArrays(dict):
    """Placeholder for a rank on another node: its buffers are never mapped here."""

    def __missing__(self, key):
        raise HcclError(HcclResult.HCCL_E_INTERNAL, "a schedule read another node's buffer outside a transfer")


def _group(fps: list[str]) -> str:
    """'ranks 0-2 called X; rank 3 called Y' from every rank's fingerprint, in rank order."""
    by: dict[str, list[int]] = {}
    for r, fp in enumerate(fps):
        by.setdefault(fp, []).append(r)
    return who_called(by)
