"""Small collectives run by the rank's own process when its stream is idle: no round trip to the card.

A small collective (≤ 256 KiB per rank, one node) is one barrier over the communicator's control block:
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

Only communicators with one rank in this process use it (a process driving several ranks from one
thread, as ``comm_init_all`` does, must never block in one rank's call), and only buffers this process
allocated itself (``rt.host.hostview.DeviceMap``); everything else goes to the card.
"""

from __future__ import annotations

import os
import threading

from rt.errors import NpuError
from rt.wire.segment import close_fds, map_received

from .errors import HcclError
from .protocol.ctrlblock import DONE, PHASE, ControlBlock, WaitAbort, wait_until
from .protocol.staged import fits_stage, stage_agrees, stage_in, stage_out, stage_source
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


class HostPath:
    """The host path of one rank of one communicator (built on its first eligible call)."""

    def __init__(self, comm, ctrl: ControlBlock):
        self.comm = comm
        self.ctrl = ctrl
        self.wait = _wait_ms() / 1000
        self.phases = ctrl.slots[:, PHASE]
        self.done = 0                   # collectives completed in this process
        self.handed = 0                 # started here, finished by the card

    @classmethod
    def build(cls, comm) -> "HostPath | None":
        """The host path for ``comm``, or None when it must not or cannot have one."""
        if not enabled() or _local_ranks.get(comm.id, 0) != 1 or len({m[0] for m in comm.members}) != 1:
            return None
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
        return cls(comm, ControlBlock(arr, comm.size))

    def run(self, stream, seq: int, op: str, params: dict, buffers: dict) -> bool:
        """Run collective ``seq`` here if possible; False (nothing done) means: submit it to the card."""
        self.handed_task = None          # the stream task the rest went to, when the card finishes it
        if not fits_stage(op, params, self.comm.size):
            return False
        with self.comm.ctx.devmap.hold():
            return self._run(stream, seq, op, params, buffers)

    def _run(self, stream, seq, op, params, buffers) -> bool:
        comm, ctrl, rank = self.comm, self.ctrl, self.comm.rank
        views = {}
        try:
            for name, buf in buffers.items():
                if buf is not None and buf[1]:
                    views[name] = comm.ctx.devmap.view(buf[0], buf[1])
                    if views[name] is None:
                        return False
        except NpuError:                # the card is gone or refused: its own path reports why
            return False
        client = stream.ctx.client
        with client.stream_order(stream.id):
            # Everything before it on the stream is done, and so is every earlier collective of this
            # communicator (possibly running on another stream): the card is not touching our slot.
            if not client.stream_done(stream.id) or int(ctrl.slots[rank, DONE]) != seq - 1:
                return False
            source = stage_source(op, params, rank)
            target = stage_in(ctrl, rank, seq, params["fingerprint"], views.get(source) if source else None)
            phases = self.phases
            try:
                wait_until(lambda: phases.min() >= target, timeout=self.wait,
                      sleeper=lambda cond, seconds: ctrl.sleep(rank, cond, min(seconds, self.wait)))
            except WaitAbort:
                return self._hand_over(client, stream, seq, op, params, buffers, target)
            if not stage_agrees(ctrl, seq):
                return self._hand_over(client, stream, seq, op, params, buffers, target)
            try:
                stage_out(ctrl, rank, seq, op, params, views.get("recv"))
            except Exception:          # the card computes it again and reports what went wrong
                return self._hand_over(client, stream, seq, op, params, buffers, target)
            ctrl.slots[rank, DONE] = seq
        self.done += 1
        return True

    def _hand_over(self, client, stream, seq, op, params, buffers, target) -> bool:
        """The card finishes it (the stream's order lock is held, so it is the stream's next task)."""
        self.handed_task = client.submit(stream.id, "hccl_finish", self.comm.id, self.comm.rank, seq, op, params,
                                         {k: v for k, v in buffers.items() if v is not None}, target)
        self.handed += 1
        return True
