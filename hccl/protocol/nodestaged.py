"""Collectives across nodes, node-staged: the ranks of a node meet in the node's control block, and one leader per
node — its lowest rank — crosses nodes for all of them: the leader rank's own process when the communicator is
*host-led* (every node's leader is a rank process on the host path: :class:`HostLead`, over direct connections
between the leaders' processes, ``hccl/transport/leaders.py``), else the leader rank's card.

Every rank of a node stages its input in its stage of the node's control block (by sequence parity), publishes
its fingerprint (its last completed collective is its slot's DONE word) and arrives at the node-local barrier
(``ControlBlock.arrive(rank, local, round_=True)``, which also records the phase in its ``ROUND`` word). The leader
waits for that phase, builds the node's part of the round — every local rank's call and DONE, for a reduction
the node's partial result in rank order, else the ranks' inputs — and runs the round across nodes for the whole
node (one frame per node to the root, one answer per node: ``LeaderLink.exchange`` in ``leaders.py``, or
``NodeGroup.exchange`` in ``hccl/transport/direct.py`` between cards). It writes the node's result — or the
failure, or what the ranks disagree on — into the block's result area of that parity (the header in its own
slot: ``R_SEQ``, ``R_INFO``, ``R_LEN`` of that parity) and arrives again, which wakes the others (ranks on the
host path sleep on the block's result word: only that wakes them); they take their part from the area and bring
their own phase level with the leader's, without waking anyone.

Card tasks (``hccl/card/collective.py``) and ranks on the host path (``hccl/hostpath.py``: :class:`HostNode`)
follow the same protocol on the same block, so they mix freely. The arrival of a large collective (the
hierarchical schedules) is the same protocol without data, so a rank calling a large all_reduce and one calling
a small one meet in the same round and are told they disagree. A rank writes stage ``p`` again only at
``seq + 2``, after it took the result of ``seq + 1``, which the leader wrote after reading every stage of
``seq + 1``; the leader writes result area ``p`` again only after every rank of its node arrived at ``seq + 2``,
that is after all took the result of ``seq``: no further barrier is needed.
"""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np

from ..errors import HcclError, who_called
from ..transport.direct import GRACE, REDUCTIONS, Failed, Partial
from ..types import HcclResult, hccl_np_dtype, reduce_ufunc
from .ctrlblock import (
    ARRIVED,
    CARD,
    CLOSED,
    DONE,
    HOST_GONE,
    PHASE,
    PID,
    R_INFO,
    R_LEN,
    ROUND,
    R_SEQ,
    SLOT_WORDS,
    STATUS,
    WaitAbort,
    pid_alive,
    wait_until,
)
from .staged import fits_stage, numpy_number, stage_rows, stage_source, staged_bytes

DATA, FAILED, DISAGREE = 0, 1, 2          # kinds (R_INFO >> 32): a result, a failed round, calls that disagree
ACROSS_WAIT = 10          # a host-path rank waits this many times NPUSIM_HCCL_HOST_WAIT_MS (× nodes / 8 above 8)
IDLE_SLEEP = 0.5          # seconds a host lead sleeps between looks while its node calls nothing


def spec_of(op: str | None, p: dict | None) -> dict | None:
    """What the round needs to know of the call (None: an arrival, no data)."""
    if op is None:
        return None
    return {"op": op, "dtype": p["dtype"], "op_code": p.get("op", 0), "root": p.get("root"), "count": p["count"]}


def node_part(ctrl, local: list[int], seq: int, op: str | None, p: dict | None, n: int) -> Partial:
    """The node's part of round ``seq`` from its ranks' slots and stages (after every one of them arrived).

    Every round of a host-led communicator runs this in its leader's process, so the usual case — the node's
    ranks are consecutive (as rank tables number them) and all called the same — takes a few numpy calls over
    all of them at once rather than a few per rank."""
    first, count = local[0], len(local)
    together = consecutive(local)
    if together and ctrl.fingerprints_equal(seq, first, count):
        fps = {ctrl.fingerprint(first, seq): list(local)}
        done = dict(zip(local, ctrl.slots[first: first + count, DONE].tolist()))
    else:
        fps, done = {}, {}
        for r in local:
            fps.setdefault(ctrl.fingerprint(r, seq), []).append(r)
            done[r] = int(ctrl.slots[r, DONE])
    if op is None or len(fps) > 1:
        return Partial(fps, done)
    dtype = hccl_np_dtype(p["dtype"])
    nbytes, parity = staged_bytes(op, p, n, dtype), seq % 2
    if op in REDUCTIONS:       # in the output dtype, rank by rank (as the card's staged path does)
        ufunc = reduce_ufunc(p.get("op", 0))
        if together and numpy_number(dtype):        # one ufunc call, the same bits as the loop below
            acc = np.empty(nbytes // dtype.itemsize, dtype)
            ufunc.reduce(stage_rows(ctrl, parity, first, count, dtype, 0, acc.size), axis=0, out=acc)
            return Partial(fps, done, acc.view(np.uint8))
        acc = ctrl.stage(local[0], parity)[:nbytes].view(dtype).copy()
        for r in local[1:]:
            ufunc(acc, ctrl.stage(r, parity)[:nbytes].view(dtype), out=acc, casting="unsafe")
        return Partial(fps, done, acc.view(np.uint8))
    parts = {r: bytes(ctrl.stage(r, parity)[:nbytes]) if stage_source(op, p, r) else b"" for r in local}
    return Partial(fps, done, parts=parts)


def write_result(ctrl, leader: int, seq: int, op: str | None, p: dict | None, total: Partial, n: int) -> None:
    """The round's result (or what the ranks disagree on) into the result area of ``seq``'s parity."""
    if len(total.fps) > 1:
        return write_failure(ctrl, leader, seq, DISAGREE, HcclResult.HCCL_E_PARA,
                             f"ranks called different collectives: {who_called(total.fps)}")
    area, length = ctrl.result(seq % 2), 0
    if op == "all_to_all":
        nbytes = staged_bytes(op, p, n, hccl_np_dtype(p["dtype"]))
        for k in range(n):
            area[k * nbytes: (k + 1) * nbytes] = np.frombuffer(total.parts[k], np.uint8)
        length = n * nbytes
    elif op not in (None, "barrier") and total.acc is not None:
        acc = np.frombuffer(total.acc, np.uint8)
        area[:acc.size] = acc
        length = acc.size
    _header(ctrl, leader, seq, DATA, 0, length)


def write_failure(ctrl, leader: int, seq: int, kind: int, code: int, text: str) -> None:
    data = text.encode()[: ctrl.result(0).size]
    ctrl.result(seq % 2)[:len(data)] = np.frombuffer(data, np.uint8)
    _header(ctrl, leader, seq, kind, int(code), len(data))


def _header(ctrl, leader: int, seq: int, kind: int, code: int, length: int) -> None:
    s, at = ctrl.slots[leader], 3 * (seq % 2)
    s[R_INFO + at], s[R_LEN + at] = kind << 32 | code, length
    s[R_SEQ + at] = seq                 # last: a reader that sees seq sees the rest


def take_result(ctrl, leader: int, rank: int, seq: int, op: str | None, p: dict | None, n: int, recv):
    """This rank's part of the node's result of ``seq`` into ``recv`` (uint8 or None). Returns None, or (kind,
    code, text) of a failure (nothing written then)."""
    words, at = ctrl.words, leader * SLOT_WORDS + 3 * (seq % 2)
    if words[R_SEQ + at] != seq:
        text = f"EI0002 rank {leader}, which leads this node's exchange, left no result for collective #{seq}"
        return FAILED, int(HcclResult.HCCL_E_INTERNAL), text
    info, length = words[R_INFO + at], words[R_LEN + at]
    kind = info >> 32
    area = ctrl.results[seq % 2]
    if kind != DATA:
        return kind, info & 0xFFFFFFFF, bytes(area[:length]).decode("utf-8", "replace")
    if recv is None or op in (None, "barrier"):
        return None
    size = p["count"] * hccl_np_dtype(p["dtype"]).itemsize
    if op == "all_to_all":
        block = n * size
        for k in range(n):
            recv[k * size: (k + 1) * size] = area[k * block + rank * size: k * block + (rank + 1) * size]
    elif op in ("reduce_scatter", "scatter"):
        recv[:size] = area[rank * size: (rank + 1) * size]
    elif not (op == "broadcast" and rank == p.get("root")):
        recv[:length] = area[:length]
    return None


def consecutive(local: list[int]) -> bool:
    """Whether a node's ranks are consecutive (as rank tables number them): their slots and stages are then one
    strided range of the control block."""
    return local == list(range(local[0], local[0] + len(local)))


def result_bytes(op: str, p: dict, n: int, rank: int) -> int:
    """The bytes at the start of the node's result that :func:`take_result` copies whole into this rank's ``recv``
    when the round succeeded: what the host path copies itself (``HostNode.run``); -1 when it copies a block of
    the result instead, or nothing (a broadcast's root)."""
    if op in ("all_reduce", "reduce") or (op == "broadcast" and rank != p.get("root")):
        return p["count"] * hccl_np_dtype(p["dtype"]).itemsize
    if op == "all_gather":
        return n * p["count"] * hccl_np_dtype(p["dtype"]).itemsize
    return -1


def error_of(got, comm_id: str, seq: int, what: str) -> HcclError:
    kind, code, text = got
    if kind == DISAGREE:
        return HcclError(HcclResult(code), f"collective #{seq} on comm '{comm_id}': {text}")
    return HcclError(HcclResult(code), f"{what}: {text}")


# -- on a card --------------------------------------------------------------------------------------------
def gone(ep, ranks) -> None:
    """Raise Failed naming (with its node) a rank of ``ranks`` whose process or card is gone."""
    for r in ranks:
        slot = ep.ctrl.slots[r]
        status, pid = int(slot[STATUS]), int(slot[PID])
        where = f"rank {r} (node {ep.members[r][0]})"
        if status in (HOST_GONE, CLOSED):
            why = "its process exited" if status == HOST_GONE else "it destroyed the communicator"
            raise Failed(HcclResult.HCCL_E_REMOTE, f"EI0002 {where} is gone: {why}")
        if pid and not pid_alive(pid):
            raise Failed(HcclResult.HCCL_E_REMOTE, f"EI0002 {where} (card {int(slot[CARD])}, pid {pid}) died: its "
                                                   f"card process is gone")


def _missing(ep, seq: int, ranks) -> Failed:
    ctrl = ep.ctrl
    missing = [r for r in ranks if ctrl.slots[r, ARRIVED] < seq]
    lines = [(f"EI0002 timed out after {ep.exec_timeout:g} s (HCCL_EXEC_TIMEOUT) waiting for ranks {missing} of "
              f"node {ep.members[ranks[0]][0]} to call it")]
    lines += [f"rank {r} (node {ep.members[r][0]}): last completed collective #{int(ctrl.slots[r, DONE])}"
              for r in missing[:16]]
    return Failed(HcclResult.HCCL_E_TIMEOUT, "; ".join(lines))


def lead(ep, seq: int, op: str | None, p: dict | None, target: int) -> None:
    """The node leader's card (a communicator that is not host-led): lead round ``seq`` across nodes over the
    card processes' links (``NodeGroup.exchange`` in ``hccl/transport/direct.py``)."""
    nodes = ep.hub.by_node
    index = nodes.node_index(ep.local[0])
    lead_round(ep, seq, op, p, target,
               lambda part, spec: nodes.exchange(seq, index, part, spec, ep.exec_timeout))


def lead_round(ctx, seq: int, op: str | None, p: dict | None, target: int, exchange, fail=None) -> None:
    """Lead round ``seq`` of the node: wait for its ranks (phase ``target``), run the round across nodes for them
    (``exchange(part, spec)`` returns the whole round's Partial or raises Failed), publish the result and arrive
    again, waking them. Failures go into the result area; ``fail(Failed)`` is told when the node's own part
    could not be built (a rank missing or gone). ``ctx``: a card's endpoint or a host lead (``HostLead``) —
    ``ctrl``, ``local``, ``members``, ``n``, ``exec_timeout``, ``sleeper``."""
    ctrl, local = ctx.ctrl, ctx.local
    leader = local[0]
    phases = ctrl.phase_words
    try:
        try:
            try:
                wait_until(lambda: min(phases[r] for r in local) >= target, timeout=ctx.exec_timeout,
                           check=lambda: gone(ctx, [r for r in local if phases[r] < target]), sleeper=ctx.sleeper)
            except WaitAbort:
                raise _missing(ctx, seq, local) from None
        except Failed as e:
            if fail is not None:
                fail(e)
            raise
        total = exchange(node_part(ctrl, local, seq, op, p, ctx.n), spec_of(op, p))
        write_result(ctrl, leader, seq, op, p, total, ctx.n)
    except Failed as e:
        write_failure(ctrl, leader, seq, FAILED, e.code, e.detail)
    except Exception as e:  # noqa: BLE001 - every rank of the node reports it, none waits for nothing
        write_failure(ctrl, leader, seq, FAILED, HcclResult.HCCL_E_INTERNAL, f"{type(e).__name__}: {e}")
    finally:
        ctrl.words[leader * SLOT_WORDS + PHASE] = target + 1
        ctrl.notify()                   # the cards waiting (on the block's word)
        ctrl.notify_result()            # the ranks waiting on the host path


def _wait_leader(ep, seq: int, target: int, what: str) -> None:
    ctrl, leader = ep.ctrl, ep.local[0]
    words, at = ctrl.words, leader * SLOT_WORDS + PHASE

    def check():
        try:
            gone(ep, [leader])
        except Failed as e:
            raise e.error(what) from None
    for timeout in (ep.exec_timeout, 3 * GRACE):
        try:
            wait_until(lambda: words[at] > target, timeout=timeout, check=check, sleeper=ep.sleeper, spin=False)
            return
        except WaitAbort:
            if ctrl.slots[leader, ARRIVED] < seq:
                raise _missing(ep, seq, [leader]).error(what) from None
    raise HcclError(HcclResult.HCCL_E_TIMEOUT, f"{what}: the exchange between nodes (led by rank {leader}) did "
                                               f"not finish within {ep.exec_timeout + 3 * GRACE:g} s")


def finish(ep, seq: int, op: str | None, p: dict | None, recv, target: int, what: str, done: bool = True) -> None:
    """A card's part after its rank arrived (phase ``target``): lead the node's round or wait for it, take this
    rank's result into ``recv`` (uint8 or None); raise what went wrong. ``done``: mark ``seq`` completed."""
    ctrl, rank, leader = ep.ctrl, ep.rank, ep.local[0]
    if rank == leader and not ep.host_leads:        # host-led: the leader's process leads (``HostLead``)
        lead(ep, seq, op, p, target)
    else:
        try:
            _wait_leader(ep, seq, target, what)
        finally:
            ctrl.words[rank * SLOT_WORDS + PHASE] = target + 1      # level with the leader; nobody waits on it
    got = take_result(ctrl, leader, rank, seq, op, p, ep.n, recv)
    if got is not None or done:
        ctrl.slots[rank, DONE] = seq
    if got is not None:
        raise error_of(got, ep.comm_id, seq, what)


def arrive(ep, seq: int, what: str) -> None:
    """Every rank (all nodes) called collective ``seq`` (its fingerprint and ARRIVED already published), or an
    HcclError saying who called what."""
    finish(ep, seq, None, None, None, ep.ctrl.arrive(ep.rank, ep.local, round_=True), what, done=False)


# -- on the host path -----------------------------------------------------------------------------------------
class HostNode:
    """The host path's part across nodes (``hccl/hostpath.py``): a rank stages, arrives and takes its result from
    the block itself — on a host-led communicator the leader rank too (its process's ``HostLead`` leads); else the
    leader stages, arrives and hands the round to its card (a stream task: the card's stream worker leads, the
    card's reader thread is never blocked), then waits for it in the block like the others (so its next
    synchronize usually finds the stream done). A rank whose
    leader has not published within ``ACROSS_WAIT`` × NPUSIM_HCCL_HOST_WAIT_MS (× nodes / 8 above 8 nodes), or
    that sees a failure, hands the rest to its card, which reports it at synchronize."""

    def __init__(self, comm, wait: float, ctrl):
        node = comm.members[comm.rank][0]
        self.local = [r for r, m in enumerate(comm.members) if m[0] == node]
        self.leader = self.local[0]
        # the local ranks' phase words as one slice when they are consecutive ranks (the usual rank table): the
        # arrival's check is then one min() over it (``ControlBlock.arrive``)
        first, last = self.local[0], self.local[-1]
        self.phases = ctrl.phase_words[first: last + 1] if consecutive(self.local) else None
        self.card_leads = comm.rank == self.leader and comm.lead is None     # host-led: it waits like the others
        self.n = comm.size
        # a round across more nodes takes longer: at 32 nodes a rank that gave up after 200 ms handed over a
        # quarter of its calls, each costing its card a task and a round trip more
        nodes = len({m[0] for m in comm.members})
        self.wait = wait * ACROSS_WAIT * max(1.0, nodes / 8)

    def run(self, path, stream, seq: int, prep, call, params) -> bool:
        """Collective ``seq`` across nodes on the host path (as ``HostPath.run``; False: nothing done, the card does
        it). The hot path of a small collective at large worlds, where every Python call costs more still (with
        64 ranks on 2 cores each rank's caches are cold at every call: docs/performance.md), so the arrival
        (``HostPath.arrive``) and the common case of ``take_result`` — a result copied whole into ``recv`` — are
        written out here."""
        ctrl, rank, leader = path.ctrl, path.comm.rank, self.leader
        words, slot = ctrl.words, rank * SLOT_WORDS
        client = stream.ctx.client
        with prep.order:
            if not client.stream_done(stream.id) or words[slot + DONE] != seq - 1:
                return False
            parity = seq & 1
            staged = prep.stage_in[parity]
            if staged is not None:
                staged[0][:] = staged[1]
            prep.fp_area[parity][:] = prep.fp_bytes
            words[slot + ARRIVED] = seq
            target = ctrl.arrive(rank, self.local, round_=True, phases=self.phases)
            at = leader * SLOT_WORDS + PHASE
            if self.card_leads:
                # Its card leads the round. Waiting for that here (bounded) rather than in the synchronize that
                # follows lets that find the stream done without a round trip to the card.
                path._hand_over(client, stream, seq, call, params, target)
                self._until_led(ctrl, rank, at, target)
                return True
            if words[at] <= target and not self._until_led(ctrl, rank, at, target):
                return path._hand_over(client, stream, seq, call, params, target)
            take, head = prep.take[parity], leader * SLOT_WORDS + 3 * parity
            if take is not None and words[head + R_SEQ] == seq and words[head + R_INFO] == 0 \
                    and words[head + R_LEN] == prep.take_len:
                take[0][:] = take[1]    # the result, whole: take_result's common case
            else:
                try:
                    got = take_result(ctrl, leader, rank, seq, prep.op, prep.params, self.n, prep.views.get("recv"))
                except Exception:          # noqa: BLE001 - the card takes it again and reports what went wrong
                    got = True
                if got is not None:
                    return path._hand_over(client, stream, seq, call, params, target)
            words[slot + PHASE] = target + 1
            words[slot + DONE] = seq
        path.done += 1
        return True

    def _until_led(self, ctrl, rank: int, at: int, target: int) -> bool:
        """Wait (at most ``self.wait``) for the node's leader to publish the round of phase ``target``: asleep on
        the block's result word, which only a publication bumps (one wake-up per round, usually)."""
        words = ctrl.words
        if words[at] > target:
            return True
        end = time.monotonic() + self.wait
        while True:
            ctrl.sleep_result(rank, at, target, min(self.wait, 0.05))
            if words[at] > target:
                return True
            if time.monotonic() >= end:
                return False


class HostLead:
    """The thread of a node leader's process that leads every round of its node on a host-led communicator
    (``hccl/transport/leaders.py``): whether the leader rank's own part of a collective ran in its process or on
    its card, its arrival at the round (the phase in its slot's ``ROUND`` word, its sequence number in
    ``ARRIVED``) wakes this thread, which waits for the rest of the node, exchanges the node's part with the
    root's process over ``link`` and publishes the result (:func:`lead_round`). What each round is comes from
    the rank's own calls (:meth:`expect`, before the call runs or goes to the card); a large collective's round
    is its arrival, without data."""

    def __init__(self, comm, ctrl, link):
        self.ctrl, self.link, self.comm_id = ctrl, link, comm.id
        self.comm = weakref.ref(comm)       # a communicator dropped without comm_destroy stops its lead too
        self.members, self.n = comm.members, comm.size
        node = comm.members[comm.rank][0]
        self.local = [r for r, m in enumerate(comm.members) if m[0] == node]
        self.exec_timeout = float(comm.options.get("exec_timeout", 1836))
        self.calls: dict[int, tuple] = {}
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name=f"hccl-lead-{comm.id}", daemon=True)
        self.thread.start()

    def sleeper(self, cond, seconds: float) -> None:
        self.ctrl.lead_sleep(cond, seconds)

    def expect(self, seq: int, op: str, p: dict) -> None:
        """The leader rank's collective ``seq`` is about to run: what its round carries."""
        small = fits_stage(op, p, self.n, across_nodes=True)
        self.calls[seq] = (op, p) if small else (None, None)

    def stop(self) -> None:
        self.stopped = True
        self.ctrl.notify()

    def _run(self) -> None:
        ctrl, words, leader = self.ctrl, self.ctrl.words, self.local[0]
        at = leader * SLOT_WORDS
        last = words[at + ROUND]
        try:
            while not self.stopped:
                if words[at + ROUND] <= last:
                    ctrl.lead_sleep(lambda: words[at + ROUND] > last or self.stopped, IDLE_SLEEP)
                    comm = self.comm()
                    if comm is None or comm.destroyed:
                        break
                    continue
                target, seq = words[at + ROUND], words[at + ARRIVED]
                last = target
                call = self.calls.pop(seq, None)
                for old in [k for k in self.calls if k < seq]:      # calls whose card task failed before arriving
                    del self.calls[old]
                if call is None:
                    write_failure(ctrl, leader, seq, FAILED, HcclResult.HCCL_E_INTERNAL,
                                  f"EI0002 rank {leader} arrived at collective #{seq} on comm '{self.comm_id}' "
                                  f"without calling it")
                    words[at + PHASE] = target + 1
                    ctrl.notify()
                    ctrl.notify_result()
                    continue
                op, p = call
                lead_round(self, seq, op, p, target,
                           lambda part, spec, seq=seq: self.link.exchange(seq, part, spec, self.exec_timeout),
                           fail=lambda failure, seq=seq: self.link.fail(seq, failure))
        finally:
            self.link.close()
