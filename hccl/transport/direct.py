"""The cross-node half of a communicator: groups of ranks, their leaders and the root, over direct links.

A *round* of collective ``seq`` merges what every rank contributes (its call's fingerprint, last completed
collective and, for a small collective, its input) group by group: each group's leader merges its group's
items (for a reduction: one partial sum of the group's inputs) and sends one frame to the root (the group
holding rank 0) over a direct link (``link.py``); the root merges every group's frame, finishes the result
once and sends it back, one frame per group. So per collective only leaders cross processes
(2 x (groups - 1) frames) and a reduction costs one pass over each input.

The groups of a ``NodeGroup`` are the communicator's nodes: every collective across nodes starts with its
round, driven by each node's leader card from the node's control block (``hccl/protocol/nodestaged.py``). A
``Group``'s are the ranks whose cards live in one process, which hand their items over in memory (the last to
arrive leads; ``DirectHub.arrive`` / ``small``). Step data of large collectives (hierarchical schedules) goes
straight from the sending rank's process to the receiving rank's, as one frame (``DirectHub.send`` / ``recv``).

Failures name ranks: a rank that never arrives is named by its own group (``waiting for ranks [6]``) and, with
its last completed collective, by the root, which sends that text to every group that did arrive; a rank whose
process left is named by the root from its card's notice (``left``).
"""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np

from ..errors import HcclError, who_called
from ..types import HcclResult, hccl_np_dtype, reduce_ufunc
from .link import LinkClosed, LinkServer

POLL = 0.2            # seconds between looks for ranks that left while a round waits for them
GRACE = 10.0          # seconds a leader waits for the root beyond HCCL_EXEC_TIMEOUT (the root reports first)
REDUCTIONS = ("all_reduce", "reduce", "reduce_scatter")


class Failed(Exception):
    """A round failed: ``code`` (HcclResult) and what happened; each rank raises it as an HcclError naming its
    own call."""

    def __init__(self, code: int, detail: str):
        super().__init__(detail)
        self.code, self.detail = int(code), detail

    def error(self, what: str) -> HcclError:
        return HcclError(HcclResult(self.code), f"{what}: {self.detail}")


class Partial:
    """What a set of ranks contributes to a round: who called what, their last completed collectives, and
    their data — a running reduction (``acc``), or each rank's input (``parts``), or None."""

    __slots__ = ("acc", "done", "fps", "parts")

    def __init__(self, fps: dict, done: dict, acc=None, parts=None):
        self.fps, self.done, self.acc, self.parts = fps, done, acc, parts

    def to_frame(self):
        parts = sorted((self.parts or {}).items())
        header = {"fps": self.fps, "done": list(self.done.items()), "acc": self.acc is not None,
                  "parts": [[r, len(b)] for r, b in parts] if self.parts is not None else None}
        payload = bytes(self.acc) if self.acc is not None else b"".join(bytes(b) for _, b in parts)
        return header, payload

    @classmethod
    def from_frame(cls, header, payload) -> Partial:
        parts, acc = None, None
        if header["parts"] is not None:
            parts, at = {}, 0
            for r, nbytes in header["parts"]:
                parts[r] = payload[at: at + nbytes]
                at += nbytes
        elif header["acc"]:
            acc = payload
        return cls(header["fps"], dict(header["done"]), acc, parts)


def merge(partials: list[Partial], spec: dict | None) -> Partial:
    """One Partial of several, in the order given (ranks ascending): reductions combine in that order."""
    fps: dict[str, list] = {}
    done: dict = {}
    for p in partials:
        for fp, ranks in p.fps.items():
            fps.setdefault(fp, []).extend(ranks)
        done.update(p.done)
    if len(fps) > 1 or spec is None:
        return Partial(fps, done)
    if spec["op"] in REDUCTIONS:
        dtype = hccl_np_dtype(spec["dtype"])
        ufunc = reduce_ufunc(spec.get("op_code", 0))
        acc = np.frombuffer(partials[0].acc, dtype).copy()
        for p in partials[1:]:
            ufunc(acc, np.frombuffer(p.acc, dtype), out=acc, casting="unsafe")
        return Partial(fps, done, acc.view(np.uint8))
    parts: dict = {}
    for p in partials:
        parts.update(p.parts)
    return Partial(fps, done, parts=parts)


def finish(total: Partial, spec: dict | None, n: int) -> Partial:
    """The root's last step: what every rank copies from (an all_gather concatenated once, a broadcast's or
    scatter's root input alone) — so no rank does the n-way work again."""
    if spec is None or len(total.fps) > 1 or total.parts is None:
        return total
    op = spec["op"]
    if op == "all_gather":
        return Partial(total.fps, total.done, b"".join(bytes(total.parts[k]) for k in range(n)))
    if op in ("broadcast", "scatter"):
        return Partial(total.fps, total.done, total.parts.get(spec["root"], b""))
    return total


class _Round:
    __slots__ = ("error", "event", "items", "result", "taken")

    def __init__(self):
        self.items: dict[int, Partial] = {}
        self.event = threading.Event()
        self.result: Partial | None = None
        self.error: Failed | None = None
        self.taken = 0


class Group:
    """The ranks of one communicator whose cards are in this process, and where every other group listens."""

    UP, DOWN = "c", "r"             # mailbox keys of a group's frame to the root and of the root's answer

    def __init__(self, comm_id: str, link: LinkServer, addresses: list, nodes: list):
        self.comm_id, self.link, self.n, self.nodes = comm_id, link, len(addresses), nodes
        self.addresses = addresses
        self.groups = self._grouping()                              # ranks ascending; group 0 holds rank 0
        me = tuple(link.address)
        self.index = next((i for i, g in enumerate(self.groups) if tuple(addresses[g[0]]) == me), -1)
        self.local = self.groups[self.index] if self.index >= 0 else []
        self.rounds: dict[int, _Round] = {}
        self.lock = threading.Lock()
        self.last_done: dict[int, int] = {}                        # the root's record, for timeout reports
        self.gone: dict[int, str] = {}                             # ranks of this process that left for good
        self._by_node: NodeGroup | None = None

    def _grouping(self) -> list[list[int]]:
        by_process: dict[tuple, list[int]] = {}
        for r, a in enumerate(self.addresses):
            by_process.setdefault(tuple(a), []).append(r)
        return sorted(by_process.values(), key=min)

    def by_node(self) -> NodeGroup:
        """The per-node rounds of this communicator in this process (``hccl/protocol/nodestaged.py``)."""
        with self.lock:
            if self._by_node is None:
                self._by_node = NodeGroup(self.comm_id, self.link, self.addresses, self.nodes)
            return self._by_node

    def where(self, rank: int) -> str:
        return f"rank {rank} (node {self.nodes[rank]})"

    # -- one round ------------------------------------------------------------------------------------
    def round(self, rank: int, seq: int, item: Partial, spec, what: str, timeout: float) -> Partial:
        with self.lock:
            rd = self.rounds.setdefault(seq, _Round())
            rd.items[rank] = item
            last = len(rd.items) == len(self.local)
        if last:
            try:
                rd.result = self._lead(seq, [rd.items[r] for r in self.local], spec, timeout)
            except Failed as e:
                rd.error = e
            rd.event.set()
        elif not self._wait_local(rd, what, timeout):
            missing = [r for r in self.local if r not in rd.items]
            if missing:
                raise HcclError(HcclResult.HCCL_E_TIMEOUT, f"{what}: EI0002 timed out after {timeout:g} s "
                                                           f"(HCCL_EXEC_TIMEOUT) waiting for ranks {missing} "
                                                           f"of this node to call it")
            if not rd.event.wait(3 * GRACE):
                raise HcclError(HcclResult.HCCL_E_TIMEOUT, f"{what}: the exchange between nodes did not finish "
                                                           f"within {timeout + 3 * GRACE:g} s")
        with self.lock:
            rd.taken += 1
            if rd.taken == len(self.local):
                self.rounds.pop(seq, None)
        if rd.error is not None:
            raise rd.error.error(what)
        return rd.result

    def _wait_local(self, rd: _Round, what: str, timeout: float) -> bool:
        """Wait for this group's round to be led; raises if a missing rank of the group is gone."""
        deadline = time.monotonic() + timeout
        while not rd.event.wait(min(POLL, max(0.0, deadline - time.monotonic()))):
            dead = [r for r in self.local if r not in rd.items and r in self.gone]
            if dead:
                raise self._gone(dead[0], self.gone[dead[0]]).error(what)
            if time.monotonic() >= deadline:
                return False
        return True

    def left(self, rank: int, why: str) -> None:
        """Rank ``rank`` of this process left for good (``why``): its group and the root stop waiting for it."""
        self.gone[rank] = why
        try:
            self.link.send(self.addresses[0], self.comm_id, ("gone", rank), why, b"")
        except LinkClosed:
            pass

    def _gone(self, rank: int, why: str) -> Failed:
        return Failed(HcclResult.HCCL_E_REMOTE, f"EI0002 {self.where(rank)} is gone: {why}")

    def _lead(self, seq: int, items: list[Partial], spec, timeout: float) -> Partial:
        return self.exchange(seq, self.index, merge(items, spec), spec, timeout)

    def exchange(self, seq: int, index: int, mine: Partial, spec, timeout: float) -> Partial:
        """Group ``index``'s part ``mine`` of round ``seq`` to the root and the whole round's result back (the
        root: every group's part in, the result out to each)."""
        if len(self.groups) == 1:
            return finish(mine, spec, self.n)
        if index != 0:
            self._send(self.groups[0][0], (self.UP, seq, index), *mine.to_frame())
            got = self.link.mailbox.take((self.comm_id, self.DOWN, seq, index), timeout + GRACE)
            if got is None:
                raise Failed(HcclResult.HCCL_E_TIMEOUT, f"EI0002 timed out after {timeout + GRACE:g} s waiting for "
                                                        f"the root ({self.where(0)}'s card process) to answer the "
                                                        f"exchange between nodes")
            header, payload = got
            if "error" in header:
                raise Failed(header["code"], header["error"])
            return Partial.from_frame(header, payload)
        return self._root(seq, mine, spec, timeout)

    def _root(self, seq: int, mine: Partial, spec, timeout: float) -> Partial:
        deadline = time.monotonic() + timeout
        got: list[Partial | None] = [mine] + [None] * (len(self.groups) - 1)
        error = None
        for g in range(1, len(self.groups)):
            while got[g] is None and error is None:
                left = deadline - time.monotonic()
                frame = self.link.mailbox.take((self.comm_id, self.UP, seq, g), min(POLL, max(0.0, left)))
                if frame is not None:
                    got[g] = Partial.from_frame(*frame)
                elif (dead := self._dead(got)) is not None:
                    error = self._gone(*dead)
                elif left <= 0:
                    break
        arrived = [g for g, p in enumerate(got) if p is not None]
        for g in arrived:
            self.last_done.update(got[g].done)
        if error is None and len(arrived) < len(self.groups):
            missing = [r for g, p in enumerate(got) if p is None for r in self.groups[g]]
            error = Failed(HcclResult.HCCL_E_TIMEOUT, (
                f"EI0002 timed out after {timeout:g} s (HCCL_EXEC_TIMEOUT) waiting for ranks {missing} "
                f"(node {sorted({self.nodes[r] for r in missing})}); "
                + "; ".join(f"{self.where(r)}: last completed collective #{self.last_done.get(r, 0)}"
                            for r in missing[:16])))
        if error is not None:            # every group: one that had not arrived finds it when it does
            for g in range(1, len(self.groups)):
                self._post(g, seq, {"error": error.detail, "code": error.code}, b"")
            raise error
        total = finish(merge(got, spec), spec, self.n)
        header, payload = total.to_frame()
        for g in range(1, len(self.groups)):
            self._post(g, seq, header, payload)
        return total

    def _dead(self, got: list) -> tuple[int, str] | None:
        """(rank, why) of a rank that left for good among the groups that have not answered."""
        for g, p in enumerate(got):
            if p is None:
                for r in self.groups[g]:
                    notice = self.link.mailbox.peek((self.comm_id, "gone", r))
                    if notice is not None:
                        return r, notice[0]
        return None

    def _post(self, g: int, seq: int, header, payload) -> None:
        try:
            self.link.send(self.addresses[self.groups[g][0]], self.comm_id, (self.DOWN, seq, g), header, payload)
        except LinkClosed:
            pass        # that group's process is gone: its own ranks' waits say so

    def _send(self, rank: int, key: tuple, header, payload) -> None:
        try:
            self.link.send(self.addresses[rank], self.comm_id, key, header, payload)
        except LinkClosed as e:
            raise Failed(HcclResult.HCCL_E_REMOTE, f"EI0002 the card process of {self.where(rank)} is "
                                                   f"unreachable: {e}") from None


class NodeGroup(Group):
    """The rounds of small collectives and arrivals across nodes: the groups are the communicator's nodes, each
    led by its lowest rank's card (``hccl/protocol/nodestaged.py``), which hands in its node's part
    (:meth:`Group.exchange`) — one frame per node to the root, one answer per node, keyed apart from the
    per-process rounds."""

    UP, DOWN = "n", "nr"

    def _grouping(self) -> list[list[int]]:
        by_node: dict = {}
        for r, node in enumerate(self.nodes):
            by_node.setdefault(node, []).append(r)
        return sorted(by_node.values(), key=min)

    def node_index(self, rank: int) -> int:
        """Which group (node, in the order of their lowest ranks) ``rank`` belongs to."""
        node = self.nodes[rank]
        return next(i for i, g in enumerate(self.groups) if self.nodes[g[0]] == node)


_groups: weakref.WeakValueDictionary[str, Group] = weakref.WeakValueDictionary()
_groups_lock = threading.Lock()


def group_of(comm_id: str, link: LinkServer, addresses: list, nodes: list) -> Group:
    """This process's group of communicator ``comm_id`` (shared by the hubs of its ranks here)."""
    with _groups_lock:
        g = _groups.get(comm_id)
        if g is None:
            g = _groups[comm_id] = Group(comm_id, link, addresses, nodes)
        return g


class DirectHub:
    """One rank's view of its communicator's cross-node half (what ``hccl/card/collective.py`` calls)."""

    def __init__(self, group: Group, rank: int):
        self.group, self.rank = group, rank
        self.by_node = group.by_node()          # the rounds of the node-staged protocol

    def arrive(self, rank: int, seq: int, fingerprint: str, done: int, what: str, timeout: float) -> list[str]:
        """Every rank (all nodes) has called collective ``seq``: what each one called, in rank order."""
        total = self.group.round(rank, seq, Partial({fingerprint: [rank]}, {rank: done}), None, what, timeout)
        fps = ["<nothing>"] * self.group.n
        for fp, ranks in total.fps.items():
            for r in ranks:
                fps[r] = fp
        return fps

    def small(self, rank: int, seq: int, fingerprint: str, done: int, data, op: str, p: dict, out,
              what: str, timeout: float) -> str | None:
        """A small collective in one round: this rank's ``data`` (uint8, its staged input) in, its result into
        ``out`` (uint8 or None). Returns None, or what the ranks disagree on (nothing written then)."""
        spec = {"op": op, "dtype": p["dtype"], "op_code": p.get("op", 0), "root": p.get("root"),
                "count": p["count"]}
        data = b"" if data is None else data
        if op in REDUCTIONS:
            item = Partial({fingerprint: [rank]}, {rank: done}, acc=data)
        else:
            item = Partial({fingerprint: [rank]}, {rank: done}, parts={rank: bytes(data)})
        total = self.group.round(rank, seq, item, spec, what, timeout)
        if len(total.fps) > 1:
            return f"ranks called different collectives: {who_called(total.fps)}"
        if out is None or op == "barrier":
            return None
        size = p["count"] * hccl_np_dtype(p["dtype"]).itemsize
        if op == "all_to_all":
            for k in range(self.group.n):
                out[k * size: (k + 1) * size] = np.frombuffer(total.parts[k], np.uint8)[rank * size: (rank + 1) * size]
            return None
        acc = np.frombuffer(total.acc, np.uint8)
        if op in ("reduce_scatter", "scatter"):
            acc = acc[rank * size: (rank + 1) * size]
        elif op == "broadcast" and rank == p.get("root"):
            return None
        out[:acc.size] = acc
        return None

    def left(self, status_gone: bool) -> None:
        """The endpoint closed; ``status_gone``: because its rank's process exited (others must not wait)."""
        if status_gone:
            self.group.left(self.rank, "its process exited")

    def send(self, key: tuple, array: np.ndarray, dst: int) -> None:
        """``array`` (a transfer of one schedule step) to rank ``dst``'s card process, which ``recv``s it by key."""
        a = np.ascontiguousarray(array)
        try:
            self.group._send(dst, ("d", *key), [a.dtype.str, list(a.shape)], a)
        except Failed as e:
            raise e.error(f"collective #{key[0]} on comm '{self.group.comm_id}' (rank {self.rank}), step {key[1]}")

    def recv(self, key: tuple, what: str, seq: int, timeout: float, src: int) -> np.ndarray:
        got = self.group.link.mailbox.take((self.group.comm_id, "d", *key), timeout)
        if got is None:
            raise HcclError(HcclResult.HCCL_E_TIMEOUT, f"{what}: EI0002 timed out after {timeout:g} s "
                                                       f"(HCCL_EXEC_TIMEOUT) waiting for {self.group.where(src)} to "
                                                       f"send its part of step {key[1]}")
        (dtype, shape), payload = got
        return np.frombuffer(payload, np.dtype(dtype)).reshape(shape)
