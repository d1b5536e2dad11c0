"""Rounds across nodes led by the node leaders' own processes, over direct connections between them.

The node-staged protocol (``hccl/protocol/nodestaged.py``) runs one round per collective across nodes: each node's
leader waits in the node's control block for the node's ranks, merges the node's part, exchanges it with the
root (the leader of node 0, the node of rank 0) and publishes the node's result in the block. A card can lead
(its stream task, over the card processes' links: ``direct.py``), but then every small collective crosses
two card-process threads per node and a wire hop from the leader rank to its card. When every node's leader is a
rank process that runs collectives itself (``hccl/hostpath.py``: one rank of the communicator in its process),
the communicator is *host-led*: each leader process runs :class:`HostLead`, a thread that leads every round of
the node (whether the leader rank's own call ran in its process or on its card) and exchanges with the root
over a TCP connection between the two leader processes — the same framing and token check as the cards'
links (``link.py``). Whether a communicator is host-led is decided at init from what every rank published in
the rendezvous (``hccl/comm.py``), so every card and rank agrees; a card then never leads.

Connections: every rank process that may lead listens (:func:`listener`, one per process, bound to its card's
node address); a non-root leader connects to the root's process once per communicator, presents its token
and says which communicator and node it leads; frames then go both ways on that connection, each carrying
its collective's sequence number. Failures name ranks: a node whose frame does not come within
HCCL_EXEC_TIMEOUT, a leader process whose connection closed (``is gone: its process exited``), or what a leader
found in its own node (a rank that never arrived or left) — the root sends that text to every node.
"""

from __future__ import annotations

import select
import socket
import threading
import time

import msgpack

from ..types import HcclResult
from .direct import GRACE, Failed, Partial, finish, merge
from .link import TOKEN_WAIT, admit, connect, frame_head, listen, read_frame, serve

REPORT_GRACE = 5.0    # seconds the root waits for a node's part beyond HCCL_EXEC_TIMEOUT (below GRACE)


class Closed(Exception):
    """The connection ended (the process at its other end exited) or sent something that is not a frame."""


def _frame(header, payload: bytes = b"") -> bytes:
    return frame_head(header, len(payload)) + bytes(payload)


def _send(conn: socket.socket, header, payload: bytes = b"") -> None:
    conn.sendall(_frame(header, payload))


def _read(conn: socket.socket):
    """One frame: (header, payload). Raises Closed."""
    try:
        return read_frame(conn)
    except (OSError, EOFError, ValueError, msgpack.UnpackException) as e:
        raise Closed(str(e) or type(e).__name__) from None


def _readable(conn: socket.socket, seconds: float) -> bool:
    return bool(select.select([conn], [], [], max(0.0, seconds))[0])


class Listener:
    """Where other leaders reach this process: connections filed by (communicator, node index) once they
    presented this process's token."""

    def __init__(self, host: str):
        self._sock, self.token, self.address = listen(host)
        self._ready: dict[tuple, socket.socket] = {}
        self._cv = threading.Condition()
        serve(self._sock, self._hello, "hccl-leaders")

    def _hello(self, conn: socket.socket) -> None:
        try:
            if not admit(conn, self.token):
                raise Closed("wrong token")
            conn.settimeout(TOKEN_WAIT)     # and then says which communicator and node it leads
            (kind, comm_id, index), _ = _read(conn)
            if kind != "lead":
                raise Closed(f"unknown hello {kind!r}")
            conn.settimeout(GRACE)          # frames are read once select says they came: a half-sent one is bounded
        except (OSError, EOFError, ValueError, TypeError, Closed):
            conn.close()
            return
        with self._cv:
            old = self._ready.pop((comm_id, index), None)
            if old is not None:
                old.close()
            self._ready[(comm_id, index)] = conn
            self._cv.notify_all()

    def take(self, comm_id: str, index: int, timeout: float) -> socket.socket | None:
        """The connection of node ``index``'s leader for ``comm_id`` (None if it did not come in ``timeout``)."""
        with self._cv:
            self._cv.wait_for(lambda: (comm_id, index) in self._ready, timeout)
            return self._ready.pop((comm_id, index), None)


_listener: Listener | None = None
_listener_lock = threading.Lock()


def listener(host: str) -> Listener:
    """This process's listener (started by its first communicator that may be host-led)."""
    global _listener
    with _listener_lock:
        if _listener is None:
            _listener = Listener(host)
        return _listener


class LeaderLink:
    """One node leader's side of the exchange of one communicator: to the root, or (the root) from every node.

    ``groups``: the ranks of each node in node-index order (node 0 holds rank 0); ``addresses``: where each
    node's leader process listens (``Listener.address``); ``nodes``: each rank's node, as errors name it."""

    def __init__(self, comm_id: str, index: int, groups: list[list[int]], addresses: list, nodes: list):
        self.comm_id, self.index, self.groups, self.addresses, self.nodes = comm_id, index, groups, addresses, nodes
        self.n = len(nodes)
        self.conns: dict[int, socket.socket] = {}          # the root: node index -> connection
        self.root: socket.socket | None = None
        self.last_done: dict[int, int] = {}                # the root's record, for timeout reports
        self.dead: dict[int, str] = {}                     # the root: node index -> why its connection ended

    def where(self, rank: int) -> str:
        return f"rank {rank} (node {self.nodes[rank]})"

    def close(self) -> None:
        for conn in [*self.conns.values(), self.root]:
            if conn is not None:
                conn.close()
        self.conns.clear()
        self.root = None

    def exchange(self, seq: int, mine: Partial, spec, timeout: float) -> Partial:
        """This node's part ``mine`` of round ``seq`` to the root and the round's result back (the root: every
        node's part in, the result out to each). Raises Failed."""
        if len(self.groups) == 1:
            return finish(mine, spec, self.n)
        if self.index == 0:
            return self._root(seq, mine, spec, timeout)
        leader = self.groups[0][0]
        try:
            conn = self._to_root()
            header, payload = mine.to_frame()
            _send(conn, [seq, header], payload)
            deadline = time.monotonic() + timeout + GRACE
            while True:
                if not _readable(conn, deadline - time.monotonic()):
                    raise Failed(HcclResult.HCCL_E_TIMEOUT, f"EI0002 timed out after {timeout + GRACE:g} s waiting "
                                                            f"for {self.where(leader)}, which leads the exchange "
                                                            f"between nodes, to answer")
                (got, header), payload = _read(conn)
                if got == seq:
                    break
        except (OSError, Closed):
            self.root = None
            raise Failed(HcclResult.HCCL_E_REMOTE, f"EI0002 {self.where(leader)}, which leads the exchange between "
                                                   f"nodes, is gone: its process exited") from None
        if "error" in header:
            raise Failed(header["code"], header["error"])
        return Partial.from_frame(header, payload)

    def fail(self, seq: int, failure: Failed) -> None:
        """A non-root leader could not build its node's part (a rank of its node is missing or gone): tell the
        root, which tells every node."""
        if self.index == 0 or len(self.groups) == 1:
            return
        try:
            _send(self._to_root(), [seq, {"error": failure.detail, "code": failure.code}])
        except (OSError, Closed):
            self.root = None

    def _to_root(self) -> socket.socket:
        if self.root is None:
            try:
                conn = connect(self.addresses[0])
                _send(conn, ["lead", self.comm_id, self.index])
                conn.settimeout(GRACE)      # as the root's end: no read or write of a frame blocks for ever
            except OSError as e:
                raise Closed(f"{self.addresses[0][0]}:{self.addresses[0][1]}: {e}") from None
            self.root = conn
        return self.root

    # -- the root ---------------------------------------------------------------------------------------
    def _root(self, seq: int, mine: Partial, spec, timeout: float) -> Partial:
        # a node whose own rank is late reports it itself when its leader's wait times out, which started no
        # earlier than this one: wait a little longer, so the report that names the late rank comes first
        deadline = time.monotonic() + timeout + REPORT_GRACE
        got: list[Partial | None] = [mine] + [None] * (len(self.groups) - 1)
        error = None
        for g in range(1, len(self.groups)):
            frame = self._frame(g, seq, deadline)
            if isinstance(frame, Failed):
                error = error or frame
            elif frame is not None:
                got[g] = frame
        for p in got:
            if p is not None:
                self.last_done.update(p.done)
        missing = [r for g, p in enumerate(got) if p is None for r in self.groups[g]]
        if error is None and missing:
            error = Failed(HcclResult.HCCL_E_TIMEOUT, (
                f"EI0002 timed out after {timeout:g} s (HCCL_EXEC_TIMEOUT) waiting for ranks {missing} "
                f"(node {sorted({self.nodes[r] for r in missing})}); "
                + "; ".join(f"{self.where(r)}: last completed collective #{self.last_done.get(r, 0)}"
                            for r in missing[:16])))
        if error is not None:
            self._answer(seq, {"error": error.detail, "code": error.code}, b"")
            raise error
        total = finish(merge(got, spec), spec, self.n)
        # the answer without the round's record of each rank's last completed collective: no node reads it (the
        # root keeps it for its timeout reports), and at 256 ranks it made the answer's header 4x as large and
        # 10x as slow to unpack (40 µs against 4, at every node, every round)
        self._answer(seq, *Partial(total.fps, {}, total.acc, total.parts).to_frame())
        self.last_done.update(dict.fromkeys(range(self.n), seq))
        return total

    def _frame(self, g: int, seq: int, deadline: float):
        """Node ``g``'s part of round ``seq``: a Partial, a Failed (its leader's report, or its process is gone),
        or None (not in time)."""
        if g in self.dead:
            return Failed(HcclResult.HCCL_E_REMOTE, self.dead[g])
        conn = self.conns.get(g)
        if conn is None:
            conn = self.conns[g] = _listener.take(self.comm_id, g, max(0.0, deadline - time.monotonic()))
            if conn is None:
                del self.conns[g]
                return None
        try:
            while True:
                if not _readable(conn, deadline - time.monotonic()):
                    return None
                (got, header), payload = _read(conn)
                if got == seq:
                    break                     # (an older round's part, sent after it timed out: skipped)
        except Closed:
            conn.close()
            del self.conns[g]
            leader = self.groups[g][0]
            self.dead[g] = f"EI0002 {self.where(leader)} is gone: its process exited"
            return Failed(HcclResult.HCCL_E_REMOTE, self.dead[g])
        if "error" in header:
            return Failed(header["code"], header["error"])
        return Partial.from_frame(header, payload)

    def _answer(self, seq: int, header, payload: bytes) -> None:
        frame = _frame([seq, header], payload)          # the same bytes to every node
        for g, conn in list(self.conns.items()):
            try:
                conn.sendall(frame)
            except OSError:
                pass                # that node's process is gone: its own ranks' waits say so


def host_led(members: list, host_links: list) -> bool:
    """Whether a communicator is host-led: it spans nodes and every node's leader (its lowest rank) published
    where its process listens. Cards and ranks decide it alike from the rendezvous."""
    leaders: dict = {}
    for r, m in enumerate(members):
        leaders.setdefault(m[0], r)
    return len(leaders) > 1 and all(host_links[r] for r in leaders.values())
