"""HCCL inside a card: communicator endpoints that execute collective schedules over peer memory.

A collective on a card is a stream task that (1) publishes its fingerprint and buffers in the
communicator's control block (``hccl/protocol/ctrlblock.py``), (2) waits for every rank to arrive —
checking fingerprints, peer liveness and ``HCCL_EXEC_TIMEOUT`` — and (3) runs its part of the schedule
step by step, pulling from peer card memory with a barrier between steps. Small collectives take the
staged path instead (``hccl/protocol/staged.py``: one barrier); across nodes the transport's hub carries
what cannot go through shared memory (``hccl/transport/``).
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from rt.card.queues import annotate, current_note
from rt.errors import HcclError

from ..protocol.ctrlblock import (ALIVE, ARRIVED, BUF0, CARD, CLOSED, DONE, HOST_GONE, P_COUNT, P_DTYPE, P_OFF,
                                  P_RECV_DONE, P_SEG, P_SEND, P_SIZE, PHASE, PID, STATUS, V_RCOUNT, V_SCOUNT,
                                  V_SDISPL, ControlBlock, WaitAbort, pid_alive, wait_until)
from ..protocol.staged import combine_stages, fits_stage, stage_agrees, stage_in, stage_out, stage_source
from ..types import HcclResult, apply_reduce, np_dtype


class Endpoint:
    """One rank of one communicator on this card."""

    def __init__(self, service, comm_id: str, nranks: int, rank: int, members: list, options: dict, owner):
        self.service = service
        self.card = service.card
        self.comm_id = comm_id
        self.n = nranks
        self.rank = rank
        self.members = members          # per rank: [node, card, pid]
        self.options = options
        self.owner = owner
        self.exec_timeout = float(options.get("exec_timeout", 1836))
        self.ctrl: ControlBlock | None = None
        self.scratch_ptr = None
        self.scratch_bytes = 0
        self.p2p_seq: dict[tuple[int, int], int] = {}
        self.lock = threading.Lock()
        nodes = sorted({m[0] for m in members})
        self.nodes = len(nodes)

    # -- setup ---------------------------------------------------------------------------------
    def attach(self) -> None:
        here = self.card.node
        leader = min(r for r, m in enumerate(self.members) if m[0] == here)
        root_node, root_card = self.members[leader][0], self.members[leader][1]
        self.leader_card = root_card
        self.local = [r for r, m in enumerate(self.members) if m[0] == here]     # ranks of this node
        size = ControlBlock.nbytes(self.n)
        self.hub = None
        if self.nodes > 1:
            self.hub = self.service.transport.hub(self.comm_id, self.n)
        if (root_node, root_card) == (self.card.node, self.card.index):
            arr = self.service.ctrl_array(self.comm_id, size)
        else:
            arr = self.service.peer_ctrl_array(root_card, self.comm_id, size)
        self.ctrl = ControlBlock(arr, self.n)
        s = self.ctrl.slots[self.rank]
        s[PID] = os.getpid()
        s[CARD] = self.card.index
        s[STATUS] = ALIVE

    def mark(self, status: int) -> None:
        if self.ctrl is not None:
            self.ctrl.slots[self.rank, STATUS] = status
            self.ctrl.notify()

    def _sleeper(self, cond, seconds):
        self.ctrl.sleep(self.rank, cond, seconds)

    # -- liveness and reports ------------------------------------------------------------------------
    def _check_peers(self, ranks, what: str) -> None:
        for r in ranks:
            slot = self.ctrl.slots[r]
            status, pid = int(slot[STATUS]), int(slot[PID])
            if status in (HOST_GONE, CLOSED):
                why = "its process exited" if status == HOST_GONE else "it destroyed the communicator"
                raise HcclError(HcclResult.HCCL_E_REMOTE, f"{what}: EI0002 rank {r} (card {int(slot[CARD])}) is gone: {why}")
            if pid and not pid_alive(pid):
                raise HcclError(HcclResult.HCCL_E_REMOTE,
                                f"{what}: EI0002 rank {r} (card {int(slot[CARD])}, pid {pid}) died: its card process is gone")

    def _missing_report(self, seq: int, what: str) -> str:
        arrived = [r for r in self.local if self.ctrl.slots[r, ARRIVED] >= seq]
        missing = [r for r in self.local if r not in arrived]
        lines = [f"{what}: EI0002 timed out after {self.exec_timeout:g} s (HCCL_EXEC_TIMEOUT) waiting for ranks {missing}; "
                 f"arrived: {arrived}"]
        for r in missing:
            done = int(self.ctrl.slots[r, DONE])
            lines.append(f"rank {r} (card {int(self.ctrl.slots[r, CARD])}): last completed collective #{done}"
                         + (f" ({self.ctrl.fingerprint(r, done)})" if done else ""))
        return "; ".join(lines)

    # -- barriers --------------------------------------------------------------------------------------
    def barrier(self, what: str, seq: int) -> None:
        """Wait for the ranks of this node (every rank, on one node) to reach the same point.

        Across nodes no global barrier is needed between steps: the only data that crosses nodes is
        deposited as Ray objects (copies) and fetched by the receiver, which waits for the deposit —
        and each collective starts with a global arrival through the hub (``_hub_arrive``).
        """
        slots = self.ctrl.slots
        target = int(slots[self.rank, PHASE]) + 1
        slots[self.rank, PHASE] = target
        self.ctrl.notify()
        self._wait_phase(what, seq, target)

    def _wait_phase(self, what: str, seq: int, target: int) -> None:
        """Wait until every rank of this node reached barrier phase ``target`` (bounded by HCCL_EXEC_TIMEOUT)."""
        local, phases = self.local, self.ctrl.slots[:, PHASE]
        if len(local) == self.n:
            arrived = lambda: phases.min() >= target                 # noqa: E731
        else:
            arrived = lambda: phases[local].min() >= target          # noqa: E731
        try:
            wait_until(arrived, timeout=self.exec_timeout,
                  check=lambda: self._check_peers([r for r in local if phases[r] < target], what),
                  sleeper=self._sleeper)
        except WaitAbort:
            raise HcclError(HcclResult.HCCL_E_TIMEOUT, self._missing_report(seq, what)) from None

    def _hub_arrive(self, what: str, seq: int, fp: str) -> list[str]:
        """Every rank (all nodes) has called collective ``seq``: what each one called."""
        done = int(self.ctrl.slots[self.rank, DONE])
        return self.hub.arrive(self.rank, seq, fp, done, what, self.exec_timeout)

    def _remote_step(self, step_index: int, seq: int, step, arrays, what: str) -> dict:
        """Inter-node transfers of one step: leave what remote ranks pull from us, fetch what we pull."""
        node_of = [m[0] for m in self.members]
        here = node_of[self.rank]
        for i, t in enumerate(step):
            if t.src == self.rank and node_of[t.dst] != here and t.count:
                self.hub.send((seq, step_index, i), arrays[t.src][t.src_buf][t.src_off: t.src_off + t.count])
        fetched = {}
        for i, t in enumerate(step):
            if t.dst == self.rank and node_of[t.src] != here and t.count:
                fetched[i] = self.hub.recv((seq, step_index, i), what, seq, self.exec_timeout)
        return fetched

    # -- collectives -----------------------------------------------------------------------------------
    def collective(self, seq: int, op: str, p: dict, views: dict) -> None:
        """Run collective ``op`` #seq; ``views`` are this rank's buffers as (seg, off, nbytes)."""
        what = f"{op} #{seq} on comm '{self.comm_id}' (rank {self.rank})"
        ctrl, me = self.ctrl, self.ctrl.slots[self.rank]
        dtype = np_dtype(p["dtype"])
        if fits_stage(op, p, self.n, across_nodes=self.hub is not None):
            annotate(comm=self.comm_id, seq=seq, op=op, algo="staged")
            if self.hub is None:
                return self._staged(seq, op, p, views)
            return self._hub_staged(seq, op, p, views, what)
        sched = None
        if op != "all_to_all_v":
            sched = self.service.schedule(op, self.n, p, self.nodes)
            annotate(comm=self.comm_id, seq=seq, op=op, algo=sched.algo, steps=[])
            if sched.tmp_count:
                views = dict(views, tmp=self.scratch(sched.tmp_count * dtype.itemsize))
        fp = p["fingerprint"]
        ctrl.set_fingerprint(self.rank, seq, fp)
        for i, name in enumerate(("send", "recv", "tmp")):
            seg = views.get(name)
            me[BUF0 + 3 * i: BUF0 + 3 * i + 3] = seg if seg is not None else (-1, 0, 0)
        if op == "all_to_all_v":
            for peer in range(self.n):
                ctrl.pairs[self.rank, peer, V_SCOUNT] = p["send_counts"][peer]
                ctrl.pairs[self.rank, peer, V_SDISPL] = p["sdispls"][peer]
                ctrl.pairs[peer, self.rank, V_RCOUNT] = p["recv_counts"][peer]
        me[ARRIVED] = seq
        if self.hub is not None:
            fps = self._hub_arrive(what, seq, fp)
        else:
            self.barrier(what, seq)                # everyone has published seq
            fps = [ctrl.fingerprint(r, seq) for r in range(self.n)]
        problem = None
        if len(set(fps)) > 1:
            problem = f"ranks called different collectives: {_group(fps)}"
        elif op == "all_to_all_v" and self.hub is not None:     # every rank is here: all refuse alike
            me[DONE] = seq
            raise HcclError(HcclResult.HCCL_E_NOT_SUPPORT, f"{what}: all_to_all_v across nodes is not supported")
        elif op == "all_to_all_v":
            bad = [(i, j, int(ctrl.pairs[i, j, V_SCOUNT]), int(ctrl.pairs[i, j, V_RCOUNT]))
                   for i in range(self.n) for j in range(self.n)
                   if ctrl.pairs[i, j, V_SCOUNT] != ctrl.pairs[i, j, V_RCOUNT]]
            if bad:
                problem = "send and recv counts disagree: " + "; ".join(
                    f"rank {i} sends {a} elements to rank {j}, which expects {b}" for i, j, a, b in bad[:8])
        if problem:
            if self.hub is None:                   # nobody overwrites its slot before all have read it
                self.barrier(what, seq)            # (across nodes the hub holds the fingerprints: no barrier,
            me[DONE] = seq                         # as in _hub_staged, whichever path each rank took)
            raise HcclError(HcclResult.HCCL_E_PARA, f"collective #{seq} on comm '{self.comm_id}': {problem}")
        here = self.members[self.rank][0]
        arrays = {r: self._rank_arrays(r, dtype) if self.members[r][0] == here or r == self.rank else None
                  for r in range(self.n)}
        for r in range(self.n):                     # remote ranks: only their own sends are read, via Ray
            if arrays[r] is None:
                arrays[r] = _RemoteArrays()
        if sched is None:
            self._all_to_all_v(arrays, p, ctrl)
            self.barrier(what, seq)
        else:
            rop = p.get("op", 0)
            step_ends = current_note().get("steps", [])
            for si, full_step in enumerate(sched.steps):
                fetched = self._remote_step(si, seq, full_step, arrays, what) if self.hub is not None else {}
                for i, t in enumerate(full_step):
                    if t.dst != self.rank:
                        continue
                    if t.count:
                        src = fetched[i] if i in fetched else \
                            arrays[t.src][t.src_buf][t.src_off: t.src_off + t.count]
                        dst = arrays[t.dst][t.dst_buf][t.dst_off: t.dst_off + t.count]
                        if t.reduce:
                            apply_reduce(rop, dst, src)
                        elif dst.ctypes.data != src.ctypes.data:      # in-place calls: a region onto itself
                            np.copyto(dst, src)
                self.barrier(what, seq)
                step_ends.append(time.monotonic_ns())
            if not sched.steps:
                self.barrier(what, seq)
        me[DONE] = seq

    def _staged(self, seq: int, op: str, p: dict, views: dict) -> None:
        """Small collectives in one barrier: every rank copies its input into its staging area (double-
        buffered by sequence parity), waits once, then computes its own result from all the stages.

        A rank writes stage ``seq % 2`` again only at ``seq + 2``, after the barrier of ``seq + 1``, which
        nobody passes before every rank has finished reading ``seq``: no second barrier is needed.
        """
        source = stage_source(op, p, self.rank)
        view = views.get(source) if source else None
        data = self._view(view) if view is not None and view[2] else None
        target = stage_in(self.ctrl, self.rank, seq, p["fingerprint"], data)
        self.staged_finish(seq, op, p, views, target)

    def staged_finish(self, seq: int, op: str, p: dict, views: dict, target: int) -> None:
        """Wait for every rank to have staged ``seq`` (barrier phase ``target``), check the calls agree,
        compute this rank's result. Also runs collectives the host process started and handed over."""
        what = f"{op} #{seq} on comm '{self.comm_id}' (rank {self.rank})"
        if "algo" not in current_note():
            annotate(comm=self.comm_id, seq=seq, op=op, algo="staged (host handover)")
        self._wait_phase(what, seq, target)
        ctrl, me, n = self.ctrl, self.ctrl.slots[self.rank], self.n
        if not stage_agrees(ctrl, seq):
            fps = [ctrl.fingerprint(k, seq) for k in range(n)]
            self.barrier(what, seq)
            me[DONE] = seq
            raise HcclError(HcclResult.HCCL_E_PARA, f"collective #{seq} on comm '{self.comm_id}': ranks called "
                                                    f"different collectives: {_group(fps)}")
        recv = views.get("recv")
        stage_out(ctrl, self.rank, seq, op, p, self._view(recv) if recv is not None and recv[2] else None)
        me[DONE] = seq

    def _hub_staged(self, seq: int, op: str, p: dict, views: dict, what: str) -> None:
        """A small collective across nodes in one hub call: every rank sends its input along with its
        arrival and gets every rank's back, then computes its own result (as ``_staged`` does)."""
        source = stage_source(op, p, self.rank)
        view = views.get(source) if source else None
        data = self._view(view).tobytes() if view is not None and view[2] else b""
        me = self.ctrl.slots[self.rank]
        me[ARRIVED] = seq
        fps, inputs = self.hub.exchange(self.rank, seq, p["fingerprint"], int(me[DONE]), data, what,
                                        self.exec_timeout)
        me[DONE] = seq
        if len(set(fps)) > 1:
            raise HcclError(HcclResult.HCCL_E_PARA, f"collective #{seq} on comm '{self.comm_id}': ranks called "
                                                    f"different collectives: {_group(fps)}")
        recv = views.get("recv")
        combine_stages(lambda k: np.frombuffer(inputs[k], np.uint8), self.n, self.rank, op, p,
                       self._view(recv) if recv is not None and recv[2] else None)

    def _view(self, view) -> np.ndarray:
        seg, off, nbytes = view
        return self.service.segment_array(self.card.index, seg)[off: off + nbytes]

    def _all_to_all_v(self, arrays, p, ctrl) -> None:
        recv = arrays[self.rank]["recv"]
        for src in range(self.n):
            count = int(ctrl.pairs[src, self.rank, V_SCOUNT])
            if count:
                off = int(ctrl.pairs[src, self.rank, V_SDISPL])
                rd = p["rdispls"][src]
                np.copyto(recv[rd: rd + count], arrays[src]["send"][off: off + count])

    def scratch(self, nbytes: int):
        """This rank's scratch buffer in card memory (grown on demand; counts toward capacity)."""
        mem = self.card.memory
        if nbytes > self.scratch_bytes:
            if self.scratch_ptr is not None:
                mem.free(self.scratch_ptr)
                self.scratch_ptr = None
            self.scratch_ptr = mem.malloc(max(nbytes, 4096), owner=getattr(self.owner, "id", None))
            self.scratch_bytes = max(nbytes, 4096)
        seg, off = mem.locate(self.scratch_ptr, nbytes, what="hccl scratch")
        return (seg, off, nbytes)

    def _rank_arrays(self, r: int, dtype) -> dict:
        slot = self.ctrl.slots[r]
        out = {}
        card = int(slot[CARD])
        for i, name in enumerate(("send", "recv", "tmp")):
            seg, off, nbytes = (int(x) for x in slot[BUF0 + 3 * i: BUF0 + 3 * i + 3])
            if seg < 0:
                out[name] = np.empty(0, dtype)
                continue
            base = self.service.segment_array(card, seg)
            out[name] = base[off: off + nbytes].view(dtype)
        return out

    # -- point to point --------------------------------------------------------------------------------
    def post_send(self, peer: int, view, count: int, dtype: int) -> None:
        """Publish a send to ``peer`` in the pair's mailbox (after the previous one was received)."""
        key = (self.rank, peer)
        seq = self.p2p_seq[key] = self.p2p_seq.get(key, 0) + 1
        box = self.ctrl.pairs[self.rank, peer]
        if seq > 1:
            self._wait_received(peer, seq - 1)
        box[P_SEG], box[P_OFF], box[P_SIZE] = view
        box[P_COUNT], box[P_DTYPE] = count, dtype
        box[P_SEND] = seq
        self.ctrl.notify()

    def wait_send(self, peer: int) -> None:
        """Block until ``peer`` has received our latest send (HCCL send semantics)."""
        self._wait_received(peer, self.p2p_seq[(self.rank, peer)])

    def _wait_received(self, peer: int, seq: int) -> None:
        box = self.ctrl.pairs[self.rank, peer]
        what = f"send #{seq} from rank {self.rank} to rank {peer} on comm '{self.comm_id}'"
        try:
            wait_until(lambda: box[P_RECV_DONE] >= seq or box[P_RECV_DONE] < 0, timeout=self.exec_timeout,
                  check=lambda: self._check_peers([peer], what), sleeper=self._sleeper)
        except WaitAbort:
            raise HcclError(HcclResult.HCCL_E_TIMEOUT,
                            f"{what}: EI0002 rank {peer} never posted the matching recv within {self.exec_timeout:g} s "
                            f"(HCCL_EXEC_TIMEOUT)") from None
        if box[P_RECV_DONE] < 0:
            box[P_RECV_DONE] = seq
            raise HcclError(HcclResult.HCCL_E_PARA, f"{what}: the matching recv on rank {peer} expected a different "
                                                    f"count or dtype (see that rank's error)")

    def recv(self, peer: int, view, count: int, dtype: int) -> None:
        key = (peer, self.rank)
        seq = self.p2p_seq[key] = self.p2p_seq.get(key, 0) + 1
        box = self.ctrl.pairs[peer, self.rank]
        what = f"recv #{seq} on rank {self.rank} from rank {peer} on comm '{self.comm_id}'"
        try:
            wait_until(lambda: box[P_SEND] >= seq, timeout=self.exec_timeout,
                  check=lambda: self._check_peers([peer], what), sleeper=self._sleeper)
        except WaitAbort:
            raise HcclError(HcclResult.HCCL_E_TIMEOUT,
                            f"{what}: EI0002 rank {peer} never sent within {self.exec_timeout:g} s (HCCL_EXEC_TIMEOUT)") from None
        if int(box[P_COUNT]) != count or int(box[P_DTYPE]) != dtype:
            got = (int(box[P_COUNT]), int(box[P_DTYPE]))
            box[P_RECV_DONE] = -1
            self.ctrl.notify()
            raise HcclError(HcclResult.HCCL_E_PARA, f"{what}: rank {peer} sent count={got[0]} dtype={got[1]}, "
                                                    f"this rank expects count={count} dtype={dtype}")
        seg, off, nbytes = int(box[P_SEG]), int(box[P_OFF]), int(box[P_SIZE])
        src = self.service.segment_array(int(self.ctrl.slots[peer, CARD]), seg)[off: off + nbytes]
        dst = self.service.segment_array(self.card.index, view[0])[view[1]: view[1] + view[2]]
        np.copyto(dst, src)
        box[P_RECV_DONE] = seq
        self.ctrl.notify()

    def close(self, status: int = CLOSED) -> None:
        self.mark(status)
        if self.hub is not None:
            self.service.retire_hub(self.hub)
            self.hub = None
        if self.scratch_ptr is not None:
            try:
                self.card.memory.free(self.scratch_ptr)
            except Exception:
                pass
            self.scratch_ptr = None


class _RemoteArrays(dict):
    """Placeholder for a rank on another node: its buffers are never mapped here."""

    def __missing__(self, key):
        raise HcclError(HcclResult.HCCL_E_INTERNAL, "a schedule read another node's buffer outside a Ray transfer")


def _group(fps: list[str]) -> str:
    """'ranks 0-2 called X; rank 3 called Y'."""
    by: dict[str, list[int]] = {}
    for r, fp in enumerate(fps):
        by.setdefault(fp, []).append(r)
    parts = []
    for fp, ranks in by.items():
        if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
            who = f"ranks {ranks[0]}-{ranks[-1]}"
        else:
            who = ("ranks " if len(ranks) > 1 else "rank ") + ",".join(map(str, ranks))
        parts.append(f"{who} called {fp}")
    return "; ".join(parts)
