"""One rank of one communicator on a card: its slot in the control block, its peers' liveness, node
barriers and its scratch memory — what a collective (``collective.py``) and point-to-point traffic
(``p2p.py``) run on.

The communicator's control block (``hccl/protocol/ctrlblock.py``) lives in shared memory held by the
node's leader card; every rank's endpoint maps it, publishes its status and pid there, and waits on its
peers' words (futex wakeups, bounded by ``HCCL_EXEC_TIMEOUT``). Across nodes the transport's hub carries
what cannot go through shared memory (``hccl/transport/``).
"""

from __future__ import annotations

import os


from ..errors import HcclError
from ..protocol.ctrlblock import (ALIVE, ARRIVED, CARD, CLOSED, DONE, HOST_GONE, PID, STATUS, ControlBlock,
                                  WaitAbort, pid_alive, wait_until)
from ..types import HcclResult


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
        self.p2p_seq: dict[tuple[int, int], int] = {}      # (sender, receiver) -> sends so far (p2p.py)
        self.host_leads = False         # its node's rounds across nodes are led by the leader rank's process
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

    def sleeper(self, cond, seconds):
        self.ctrl.sleep(self.rank, cond, seconds)

    # -- liveness and reports ------------------------------------------------------------------------
    def check_peers(self, ranks, what: str) -> None:
        for r in ranks:
            slot = self.ctrl.slots[r]
            status, pid = int(slot[STATUS]), int(slot[PID])
            if status in (HOST_GONE, CLOSED):
                why = "its process exited" if status == HOST_GONE else "it destroyed the communicator"
                raise HcclError(HcclResult.HCCL_E_REMOTE,
                                f"{what}: EI0002 rank {r} (card {int(slot[CARD])}) is gone: {why}")
            if pid and not pid_alive(pid):
                raise HcclError(HcclResult.HCCL_E_REMOTE, f"{what}: EI0002 rank {r} (card {int(slot[CARD])}, pid "
                                                          f"{pid}) died: its card process is gone")

    def _missing_report(self, seq: int, what: str) -> str:
        arrived = [r for r in self.local if self.ctrl.slots[r, ARRIVED] >= seq]
        missing = [r for r in self.local if r not in arrived]
        lines = [f"{what}: EI0002 timed out after {self.exec_timeout:g} s (HCCL_EXEC_TIMEOUT) waiting for ranks "
                 f"{missing}; arrived: {arrived}"]
        for r in missing:
            done = int(self.ctrl.slots[r, DONE])
            lines.append(f"rank {r} (card {int(self.ctrl.slots[r, CARD])}): last completed collective #{done}"
                         + (f" ({self.ctrl.fingerprint(r, done)})" if done else ""))
        return "; ".join(lines)

    # -- barriers --------------------------------------------------------------------------------------
    def barrier(self, what: str, seq: int) -> None:
        """Wait for the ranks of this node (every rank, on one node) to reach the same point.

        Across nodes no global barrier is needed between steps: the only data that crosses nodes is sent
        as a copy to the receiver's process (``hccl/transport/direct.py``), which waits for it —
        and each collective starts with a global arrival through the hub (``collective.py``).
        """
        target = self.ctrl.arrive(self.rank, None if len(self.local) == self.n else self.local)
        self.wait_phase(what, seq, target)

    def wait_phase(self, what: str, seq: int, target: int) -> None:
        """Wait until every rank of this node reached barrier phase ``target`` (bounded by HCCL_EXEC_TIMEOUT)."""
        local, phases = self.local, self.ctrl.phase_words
        if len(local) == self.n:
            arrived = lambda: min(phases) >= target                  # noqa: E731
        else:
            arrived = lambda: min(phases[r] for r in local) >= target    # noqa: E731
        try:
            wait_until(arrived, timeout=self.exec_timeout,
                  check=lambda: self.check_peers([r for r in local if phases[r] < target], what),
                  sleeper=self.sleeper)
        except WaitAbort:
            report = self._missing_report(seq, what)
            self.ctrl.give_up(self.rank, seq, self.exec_timeout)
            raise HcclError(HcclResult.HCCL_E_TIMEOUT, report) from None

    # -- memory ----------------------------------------------------------------------------------------
    def view(self, view):
        """A uint8 view of this card's memory at ``view`` = (segment, offset, nbytes)."""
        seg, off, nbytes = view
        return self.service.segment_array(self.card.index, seg)[off: off + nbytes]

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

    def close(self, status: int = CLOSED) -> None:
        self.mark(status)
        if self.hub is not None:
            self.hub.left(status == HOST_GONE)        # the other nodes stop waiting for a rank whose process died
            self.service.retire_hub(self.hub)
            self.hub = None
        if self.scratch_ptr is not None:
            try:
                self.card.memory.free(self.scratch_ptr)
            except Exception:
                pass
            self.scratch_ptr = None
