"""The schedule model of a collective, its validator and the numpy executor (the oracle).

A collective is a ``Schedule``: ``steps`` executed in order with a barrier between them, each a
tuple of ``Transfer``s. A transfer is executed by its ``runner``: by default ``dst`` (the pull model:
it reads ``src``'s buffer and writes its own); a transfer with ``by`` set is executed by rank ``by``,
which may write a peer's buffer (a push: one rank reads a region once and writes it to every
destination while it is in its core's cache, ``mesh.broadcast``/``mesh.all_gather`` with ``push``;
only inside one node, where every rank maps every peer's memory). Within a step, the transfers of
one runner run in list order (so a rank may accumulate several peers into one region in a fixed,
deterministic order) and the transfers of different runners run concurrently. A schedule is
race-free iff, within each step, no region one runner writes is read or written by another
runner's transfers.

Buffers per rank are ``"send"``, ``"recv"`` and ``"tmp"`` (scratch of ``tmp_count`` elements,
allocated by the executor); offsets and counts are in elements. The argument conventions are
HCCL's (see ``buffer_sizes``).

The algorithm modules build schedules from *layouts*: a layout maps a logical element range of
a rank (e.g. "the whole all_reduce vector") to pieces of real buffers, so one algorithm body
serves several collectives and the hierarchical compositions (``move`` splits a logical
transfer along the piece boundaries of both sides).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import HcclError
from ..types import HcclResult, apply_reduce

BUFFERS = ("send", "recv", "tmp")
# The collectives that have schedules. all_to_all_v has none: every rank pulls its blocks directly, with the
# counts each rank publishes in the control block (``hccl/card/collective.py``).
OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "scatter", "all_to_all", "barrier")


@dataclass(frozen=True)
class Transfer:
    """``count`` elements from (src, src_buf, src_off) into (dst, dst_buf, dst_off), executed by ``runner``."""

    src: int
    src_buf: str
    src_off: int
    dst: int
    dst_buf: str
    dst_off: int
    count: int
    reduce: bool  # True: dst = op(dst, src) elementwise; False: dst = src
    by: int = -1  # the rank that executes it; -1: dst (a pull)

    @property
    def runner(self) -> int:
        return self.dst if self.by < 0 else self.by


@dataclass(frozen=True)
class Schedule:
    """A collective as steps of transfers separated by barriers (see module docstring)."""

    algo: str
    op: str
    world_size: int
    count: int
    root: int | None
    steps: tuple[tuple[Transfer, ...], ...]
    tmp_count: int

    def for_rank(self, rank: int) -> list[list[Transfer]]:
        """The transfers ``rank`` executes (its runner), one list per step, in execution order."""
        return [[t for t in step if t.runner == rank] for step in self.steps]

    @property
    def num_steps(self) -> int:
        return len(self.steps)


Steps = list[list[Transfer]]
Piece = tuple[int, int, str, int]  # logical [lo, hi) lives at buf[off : off + hi - lo]
Layout = Callable[[int, int, int], list[Piece]]


def make_schedule(algo: str, op: str, world_size: int, count: int, root: int | None,
                  steps: Steps) -> Schedule:
    """Freeze steps into a Schedule, dropping empty steps and sizing tmp from its uses."""
    frozen = tuple(tuple(step) for step in steps if step)
    tmp = 0
    for step in frozen:
        for t in step:
            if t.src_buf == "tmp":
                tmp = max(tmp, t.src_off + t.count)
            if t.dst_buf == "tmp":
                tmp = max(tmp, t.dst_off + t.count)
    return Schedule(algo, op, world_size, count, root, frozen, tmp)


# ----------------------------------------------------------------------------------------------
# Layouts and step construction (shared by the algorithm modules)

def chunk_bounds(lo: int, hi: int, parts: int) -> list[int]:
    """Split [lo, hi) into ``parts`` contiguous chunks differing by at most one element."""
    size, extra = divmod(hi - lo, parts)
    bounds = [lo]
    for i in range(parts):
        bounds.append(bounds[-1] + size + (1 if i < extra else 0))
    return bounds


def flat(buf: str, base: Callable[[int], int] | int = 0) -> Layout:
    """Logical element x of rank r lives at buf[x - base(r)]."""
    def locate(rank: int, lo: int, hi: int) -> list[Piece]:
        b = base(rank) if callable(base) else base
        return [(lo, hi, buf, lo - b)]
    return locate


def window(inner_lo: Callable[[int], int], inner_hi: Callable[[int], int],
           inner: Layout, outer: Layout) -> Layout:
    """Logical [inner_lo(r), inner_hi(r)) of rank r uses ``inner``, everything else ``outer``."""
    def locate(rank: int, lo: int, hi: int) -> list[Piece]:
        a, b = inner_lo(rank), inner_hi(rank)
        if lo == hi:  # an empty range still needs a valid address for a signalling transfer
            return (inner if a <= lo < b else outer)(rank, lo, hi)
        pieces = []
        if lo < min(hi, a):
            pieces += outer(rank, lo, min(hi, a))
        if max(lo, a) < min(hi, b):
            pieces += inner(rank, max(lo, a), min(hi, b))
        if max(lo, b) < hi:
            pieces += outer(rank, max(lo, b), hi)
        return pieces
    return locate


def by_rank(choose: Callable[[int], Layout]) -> Layout:
    """A layout that differs per rank (e.g. the root uses recv, the others tmp)."""
    return lambda rank, lo, hi: choose(rank)(rank, lo, hi)


def move(src: int, src_layout: Layout, dst: int, dst_layout: Layout, lo: int, hi: int,
         reduce: bool) -> list[Transfer]:
    """Transfers for "dst pulls logical [lo, hi) of src", split where either layout changes buffer.

    A copy of a region onto itself is dropped; an empty range becomes one zero-count transfer
    (a signal) unless it is such a self-copy.
    """
    sp, dp = src_layout(src, lo, hi), dst_layout(dst, lo, hi)
    cuts = sorted({lo, hi} | {p[0] for p in sp + dp} | {p[1] for p in sp + dp})
    cuts = [c for c in cuts if lo <= c <= hi]
    spans = list(zip(cuts, cuts[1:])) if hi > lo else [(lo, lo)]
    out = []
    for a, b in spans:
        s_lo, _, s_buf, s_off = _piece_at(sp, a)
        d_lo, _, d_buf, d_off = _piece_at(dp, a)
        t = Transfer(src, s_buf, s_off + a - s_lo, dst, d_buf, d_off + a - d_lo, b - a, reduce)
        if not reduce and src == dst and s_buf == d_buf and t.src_off == t.dst_off:
            continue
        out.append(t)
    return out


def _piece_at(pieces: list[Piece], x: int) -> Piece:
    for p in pieces:
        if p[0] <= x < p[1] or p[0] == p[1] == x:
            return p
    raise AssertionError(f"layout pieces {pieces} do not cover element {x}")


def signal(src: int, dst: int) -> Transfer:
    """A zero-count transfer: dst waits for src and moves nothing."""
    return Transfer(src, "recv", 0, dst, "recv", 0, 0, False)


def in_parallel(*phases: Steps) -> Steps:
    """Run independent phases (disjoint ranks or regions) side by side, step by step."""
    out: Steps = []
    for phase in phases:
        for i, step in enumerate(phase):
            if i == len(out):
                out.append([])
            out[i].extend(step)
    return out


# ----------------------------------------------------------------------------------------------
# Argument checks and buffer sizes

def check_args(op: str, world_size: int, count: int, root: int | None = None,
               ranks_per_node: int | None = None) -> None:
    """Raise HcclError(HCCL_E_PARA) naming the bad argument of a schedule request."""
    if not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise HcclError(HcclResult.HCCL_E_PARA, f"{op}: world_size must be an int >= 1, got {world_size!r}")
    if not isinstance(count, (int, np.integer)) or count < 0:
        raise HcclError(HcclResult.HCCL_E_PARA, f"{op}: count must be an int >= 0, got {count!r}")
    if op in ("broadcast", "reduce", "scatter"):
        if not isinstance(root, (int, np.integer)) or not 0 <= root < world_size:
            raise HcclError(HcclResult.HCCL_E_PARA,
                            f"{op}: root must be a rank in [0, {world_size}), got {root!r}")
    if ranks_per_node is not None and (ranks_per_node < 1 or world_size % ranks_per_node):
        raise HcclError(HcclResult.HCCL_E_PARA,
                        f"{op}: ranks_per_node={ranks_per_node} must be >= 1 and divide "
                        f"world_size={world_size} (ranks are contiguous per node)")


def buffer_sizes(op: str, world_size: int, count: int, *, root: int | None = None,
                 tmp_count: int | None = None) -> list[dict[str, int]]:
    """Per-rank element sizes of send/recv/tmp under HCCL's argument conventions.

    all_reduce(count) send[count] -> recv[count]; broadcast(count) one buffer, recv; reduce(count)
    send[count] everywhere, recv[count] on root only; all_gather(send_count) send[c] -> recv[c*n];
    reduce_scatter(recv_count) send[c*n] -> recv[c]; scatter(recv_count) root's send[c*n] -> recv[c];
    all_to_all(count per peer) send[c*n] -> recv[c*n]; barrier: nothing. Without ``tmp_count``
    the dicts have no "tmp" entry and ``validate`` uses the schedule's own ``tmp_count``.
    """
    n, c = world_size, count
    sizes = []
    for r in range(n):
        send, recv = {
            "all_reduce": (c, c), "broadcast": (0, c), "reduce": (c, c if r == root else 0),
            "all_gather": (c, c * n), "reduce_scatter": (c * n, c),
            "scatter": (c * n if r == root else 0, c), "all_to_all": (c * n, c * n), "barrier": (0, 0),
        }[op]
        sizes.append({"send": send, "recv": recv} if tmp_count is None else
                     {"send": send, "recv": recv, "tmp": tmp_count})
    return sizes


def _aliases(schedule: Schedule, rank: int) -> dict[str, tuple[str, int]]:
    """In-place calls: which buffer is an alias of which, at what element shift, on ``rank``."""
    c, op = schedule.count, schedule.op
    if op in ("all_reduce", "reduce"):
        return {"send": ("recv", 0)}
    if op == "all_gather":  # send is recv + rank * count
        return {"send": ("recv", rank * c)}
    if op == "reduce_scatter":  # recv is send + rank * count
        return {"recv": ("send", rank * c)}
    return {}


# ----------------------------------------------------------------------------------------------
# Validation

def validate(schedule: Schedule, sizes: Sequence[dict[str, int]] | dict[str, int], *,
             in_place: bool = False) -> None:
    """Check every transfer is in bounds and each step is race-free; raise HcclError otherwise.

    ``sizes`` gives element counts of send/recv (tmp defaults to ``schedule.tmp_count``), one dict
    per rank or one for all. ``in_place`` checks races as if send and recv alias the way HCCL's
    in-place calls do (all_reduce/reduce: send is recv; all_gather: send is recv + rank*count;
    reduce_scatter: recv is send + rank*count); a copy of a region onto itself is then a no-op.
    """
    n = schedule.world_size
    per_rank = [sizes] * n if isinstance(sizes, dict) else list(sizes)
    if len(per_rank) != n:
        raise HcclError(HcclResult.HCCL_E_PARA, f"validate: {len(per_rank)} size dicts for world_size {n}")
    where = f"{schedule.algo} {schedule.op}(n={n}, count={schedule.count}, root={schedule.root})"
    for s, step in enumerate(schedule.steps):
        # (rank, buffer) -> runner -> the ranges that runner writes there
        writes: dict[tuple[int, str], dict[int, list[tuple[int, int]]]] = {}
        accesses: list[tuple[Transfer, str, int, str, int]] = []     # (t, "reads"/"writes", rank, buf, off)
        for t in step:
            _check_bounds(t, per_rank, schedule.tmp_count, f"{where} step {s}")
            if not -1 <= t.by < n:
                raise HcclError(HcclResult.HCCL_E_INTERNAL, f"{where} step {s}: runner {t.by} out of [0, {n}) in {t}")
            if t.count == 0:
                continue
            src_buf, src_off = _canon(schedule, t.src, t.src_buf, t.src_off, in_place)
            dst_buf, dst_off = _canon(schedule, t.dst, t.dst_buf, t.dst_off, in_place)
            if not t.reduce and t.src == t.dst and (src_buf, src_off) == (dst_buf, dst_off):
                continue  # an aliased self-copy: no memory changes
            writes.setdefault((t.dst, dst_buf), {}).setdefault(t.runner, []).append((dst_off, dst_off + t.count))
            accesses.append((t, "reads", t.src, src_buf, src_off))
            if t.by >= 0:
                accesses.append((t, "writes", t.dst, dst_buf, dst_off))
        merged = {key: {runner: _merge(iv) for runner, iv in by.items()} for key, by in writes.items()}
        for t, how, rank, buf, off in accesses:
            for writer, ranges in merged.get((rank, buf), {}).items():
                if writer == t.runner:
                    continue        # one runner's transfers run in list order
                hit = _overlap(ranges, off, off + t.count)
                if hit is not None:
                    owner = "" if writer == rank else f"rank {rank}'s "
                    raise HcclError(HcclResult.HCCL_E_INTERNAL,
                                    f"{where}: race in step {s}: rank {t.runner} {how} rank {rank} {buf}"
                                    f"[{off}:{off + t.count}] while rank {writer} writes {owner}{buf}"
                                    f"[{hit[0]}:{hit[1]}] ({t})")


def _check_bounds(t: Transfer, sizes, tmp_count: int, where: str) -> None:
    n = len(sizes)
    for rank, buf, off in ((t.src, t.src_buf, t.src_off), (t.dst, t.dst_buf, t.dst_off)):
        if not 0 <= rank < n:
            raise HcclError(HcclResult.HCCL_E_INTERNAL, f"{where}: rank {rank} out of [0, {n}) in {t}")
        if buf not in BUFFERS:
            raise HcclError(HcclResult.HCCL_E_INTERNAL, f"{where}: unknown buffer {buf!r} in {t}")
        size = sizes[rank].get(buf, tmp_count if buf == "tmp" else 0)
        if t.count < 0 or off < 0 or off + t.count > size:
            raise HcclError(HcclResult.HCCL_E_INTERNAL,
                            f"{where}: rank {rank} {buf}[{off}:{off + t.count}] outside its "
                            f"{size} elements in {t}")


def _canon(schedule: Schedule, rank: int, buf: str, off: int, in_place: bool) -> tuple[str, int]:
    if in_place and buf in _aliases(schedule, rank):
        target, shift = _aliases(schedule, rank)[buf]
        return target, off + shift
    return buf, off


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _overlap(merged: list[tuple[int, int]], a: int, b: int) -> tuple[int, int] | None:
    i = bisect.bisect_right(merged, (a, float("inf"))) - 1
    for lo, hi in merged[max(i, 0):i + 2]:
        if lo < b and a < hi:
            return lo, hi
    return None


# ----------------------------------------------------------------------------------------------
# The numpy executor

def run_numpy(schedule: Schedule, sends: Sequence, recvs: Sequence, op="sum") -> list[np.ndarray]:
    """Execute every rank's transfers over numpy arrays; returns ``recvs`` (written in place).

    sends/recvs hold one 1-D array (or None for an absent buffer) per rank; arrays may alias
    (in-place calls). Reads of another rank's buffer see that buffer as it was at the start of
    the step, as concurrent execution would; a rank's own reads see its earlier writes.
    """
    n = schedule.world_size
    if len(sends) != n or len(recvs) != n:
        raise HcclError(HcclResult.HCCL_E_PARA,
                        f"run_numpy: need {n} send and recv arrays, got {len(sends)} and {len(recvs)}")
    arrays = [a for a in list(sends) + list(recvs) if a is not None]
    dtype = arrays[0].dtype if arrays else np.dtype(np.float32)
    empty = np.empty(0, dtype)
    bufs = [{"send": sends[r] if sends[r] is not None else empty,
             "recv": recvs[r] if recvs[r] is not None else empty,
             "tmp": np.zeros(schedule.tmp_count, dtype)} for r in range(n)]
    for step in schedule.steps:
        before: dict[tuple[int, str], np.ndarray] = {}
        for t in step:  # snapshot what is read remotely before anyone writes
            if t.src != t.runner and (t.src, t.src_buf) not in before:
                before[(t.src, t.src_buf)] = bufs[t.src][t.src_buf].copy()
        for t in step:
            src = before[(t.src, t.src_buf)] if t.src != t.runner else bufs[t.src][t.src_buf]
            data = src[t.src_off:t.src_off + t.count]
            dst = bufs[t.dst][t.dst_buf][t.dst_off:t.dst_off + t.count]
            if t.reduce:
                apply_reduce(op, dst, data.copy())
            else:
                dst[...] = data
    return list(recvs)
