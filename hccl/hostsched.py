"""Large collectives run by the rank's own process when its stream is idle: the card's protocol, without the card.

A collective too large for the stages (``hccl/protocol/staged.py``) runs on a card as a schedule
(``hccl/card/collective.py``): the rank publishes its fingerprint and buffers (card, segment, offset, size) in
its slot of the control block, arrives, waits for every rank, then runs the schedule's steps pulling from its
peers' card memory, with a barrier after each step. When the host path is eligible (``hccl/hostpath.py``: one
node, one rank of the communicator in this process, the stream idle, the previous collective done, buffers this
process allocated), the rank's process does exactly that itself: same slot words, same schedule (one choice,
``algos.select.for_call``, with the card's topology and ring threshold), same step code (``algos.steps``), same
barriers — so on every call some ranks may run it here and others on their cards. Peers' segments are mapped
once through the rank's card (``hccl_segment``: the card exports its own or relays a peer card's) and cached per
(card, segment) with the host path; a card never reuses a segment id (``rt/wire/segment.py`` numbers them per
process), so a cached mapping is never another segment — at worst it keeps a released one's memory until the
communicator is destroyed or the cache is cleared (``MAX_SEGMENTS``).

Hand-over, as for small collectives: if the peers have not all arrived within ``NPUSIM_HCCL_HOST_WAIT_MS``, if
the calls do not match, or if a peer's memory cannot be mapped, the card continues from the arrival
(``hccl_resume``: wait, check, steps); if a barrier between steps is not passed within ``MID_WAIT`` seconds or a
peer is gone, the card continues from the next step. The card reports what went wrong at synchronize exactly
as on the card path (``HCCL_EXEC_TIMEOUT``, the dead rank named, the mismatched calls). Schedules that need
scratch memory (``tmp_count``; e.g. reduce), schedules without steps and all_to_all_v stay on the card.
"""

from __future__ import annotations

import numpy as np

from rt.errors import NpuError
from rt.wire.segment import map_received

from . import algos
from .algos.steps import run_step
from .protocol.ctrlblock import (BUF0, CARD, CLOSED, DONE, HOST_GONE, PID, SLOT_WORDS, STATUS, WaitAbort,
                                 pid_alive, wait_until)
from .types import hccl_np_dtype

MID_WAIT = 1.0          # seconds a barrier between steps waits here before the card takes over
MAX_SEGMENTS = 256      # peer segments kept mapped per communicator (then the cache starts afresh)
NAMES = ("send", "recv", "tmp")


class LargePrepared:
    """What a large collective computes once per call signature: its schedule, the views of this rank's buffers
    and where they live on the card (again when the device map forgot an allocation), its fingerprint bytes."""

    large = True

    def __init__(self, path, call, sched):
        ctrl, rank, p = path.ctrl, path.comm.rank, call.params
        self.op, self.params, self.sched = call.op, p, sched
        self.dtype = hccl_np_dtype(p["dtype"])
        self.rop = p.get("op", 0)
        self.fp_area, self.fp_bytes, self.fp_all, self.fp_agreed = ctrl.fingerprint_setup(rank, p["fingerprint"])
        self.generation = -1
        self.mine: dict = {}                                  # name -> typed view of this rank's buffer
        self.buf_words = np.full(9, 0, np.int64)              # BUF0.. as the card publishes them
        self.buf_slot = ctrl.slots[rank, BUF0: BUF0 + 9]       # where they go
        self.seen: dict = {}            # every rank's published buffers (bytes) -> their arrays (``_arrays``)

    def publish(self, parity: int) -> None:
        """This rank's part of the call before it arrives: its fingerprint and buffers, as the card publishes them."""
        self.fp_area[parity][:] = self.fp_bytes
        self.buf_slot[:] = self.buf_words

    def refresh(self, devmap, buffers) -> bool:
        """Views of the buffers and their (segment, offset) again; False: not all are this process's."""
        mine, words = {}, [-1, 0, 0] * 3
        for name, buf in buffers.items():
            if buf is None:
                continue
            view = devmap.view(buf[0], buf[1])
            where = devmap.where(buf[0], buf[1]) if view is not None else None
            if where is None:
                return False
            mine[name] = view.view(self.dtype)
            i = NAMES.index(name)
            words[3 * i: 3 * i + 3] = [where[0], where[1], buf[1]]
        self.mine = mine
        self.seen.clear()
        self.buf_words[:] = words
        return True


def prepare(path, call) -> LargePrepared | None:
    """The large-collective form of ``call`` for host path ``path``, or None: it stays on the card."""
    if call.op == "all_to_all_v":
        return None
    if path.sched_config is None:
        try:
            path.sched_config = tuple(path.comm.ctx.client.call("hccl_segment", path.comm.id, path.comm.rank,
                                                                None, None))
        except NpuError:
            return None
    sched = algos.select.for_call(call.op, path.comm.size, call.params, 1, *path.sched_config)
    if sched.tmp_count or not sched.steps or any(name not in NAMES for name in call.buffers):
        return None
    return LargePrepared(path, call, sched)


def run(path, stream, seq: int, prep: LargePrepared, call, params) -> bool:
    """Run large collective ``seq`` here (or start it and hand the rest to the card); False: nothing done."""
    ctrl, rank = path.ctrl, path.comm.rank
    words, slot = ctrl.words, rank * SLOT_WORDS
    client = stream.ctx.client
    with client.stream_order(stream.id):
        target = path.arrive(client, stream, seq, prep)
        if target is None:
            return False
        parity = seq & 1
        here = (path, client, stream, seq, call, params)
        if not _wait(path, target, path.wait):
            return _hand_over(*here, target, 0, False)
        if prep.fp_all[parity].tobytes() != prep.fp_agreed:
            return _hand_over(*here, target, 0, False)
        try:
            arrays = _arrays(path, prep)
        except (NpuError, OSError):
            return _hand_over(*here, target, 0, False)
        for si in range(len(prep.sched.steps)):
            run_step(prep.sched, si, rank, arrays, prep.rop)
            target = ctrl.arrive(rank)
            if not _wait(path, target, MID_WAIT):
                return _hand_over(*here, target, si + 1, True)
        words[slot + DONE] = seq
    path.done += 1
    return True


def _wait(path, target: int, timeout: float) -> bool:
    """Wait until every rank reached barrier phase ``target``; False: not within ``timeout`` or a peer is gone."""
    ctrl, rank = path.ctrl, path.comm.rank
    phases = ctrl.phase_words
    if min(phases) >= target:
        return True
    # No yielding first (``Spinner``): peers' steps take hundreds of µs, so a yielding waiter gives up and sleeps
    # anyway, having burnt the yields (1 MiB all_reduce, 8 ranks on 2 cores: 800 -> 400 µs of a rank's CPU per call).
    try:
        wait_until(lambda: min(phases) >= target, timeout=timeout, check=lambda: _alive(ctrl, target),
                   sleeper=lambda cond, seconds: ctrl.sleep(rank, cond, min(seconds, timeout)), spin=False)
    except WaitAbort:
        return False
    return True


def _alive(ctrl, target: int) -> None:
    """Raise WaitAbort if a rank that has not reached ``target`` is gone (its card reports which and why)."""
    for r in range(ctrl.n):
        if ctrl.phase_words[r] < target:
            s = ctrl.slots[r]
            if int(s[STATUS]) in (HOST_GONE, CLOSED) or not pid_alive(int(s[PID])):
                raise WaitAbort()


def _arrays(path, prep: LargePrepared) -> dict:
    """Every rank's send/recv/tmp buffers as published: this rank's own views, peers' through their segments
    (remembered per signature for what every rank published: a training loop repeats the same buffers)."""
    ctrl, rank, dtype = path.ctrl, path.comm.rank, prep.dtype
    key = ctrl.slots[:, BUF0: BUF0 + 9].tobytes() + ctrl.slots[:, CARD].tobytes()
    out = prep.seen.get(key)
    if out is not None:
        return out
    out = {}
    for r in range(ctrl.n):
        if r == rank:
            out[r] = {name: prep.mine.get(name, np.empty(0, dtype)) for name in NAMES}
            continue
        s = ctrl.slots[r]
        card, arrays = int(s[CARD]), {}
        for i, name in enumerate(NAMES):
            seg, off, nbytes = (int(x) for x in s[BUF0 + 3 * i: BUF0 + 3 * i + 3])
            arrays[name] = np.empty(0, dtype) if seg < 0 else _segment(path, card, seg)[off: off + nbytes].view(dtype)
        out[r] = arrays
    if len(prep.seen) >= 16:
        prep.seen.clear()
    prep.seen[key] = out
    return out


def _segment(path, card: int, seg: int) -> np.ndarray:
    """uint8 view of segment ``seg`` of card ``card`` of this node (mapped once, through this rank's card)."""
    cache = path.segments
    arr = cache.get((card, seg))
    if arr is None:
        reply, fds = path.comm.ctx.client.call("hccl_segment", path.comm.id, path.comm.rank, card, seg, want_fds=True)
        arr = map_received(fds, reply)          # closes the fds, mapped or not
        if len(cache) >= MAX_SEGMENTS:
            cache.clear()
        cache[(card, seg)] = arr
    return arr


def _hand_over(path, client, stream, seq, call, params, target, start, checked) -> bool:
    """The card continues from barrier phase ``target`` before step ``start`` (the stream's order lock is held,
    so it is the stream's next task)."""
    path.handed_task = client.submit(stream.id, "hccl_resume", path.comm.id, path.comm.rank, seq, call.op, params,
                                     call.wire, target, start, checked)
    path.handed += 1
    return True
