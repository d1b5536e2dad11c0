"""One rank's part of one step of a schedule over mapped buffers: what the card (``hccl/card/collective.py``) and
the rank's own process (``hccl/hostsched.py``) both execute, so the two produce the same bits for the same
schedule — same transfers, same per-element order, same reduction calls.

A rank's transfers of a step run in list order. Consecutive ones that write the same region (a reduce-scatter:
own block copied in, then every peer's reduced onto it) run chunk by chunk, ``CHUNK_BYTES`` at a time, all
of them on one chunk before the next: the region being accumulated stays in the core's cache instead of
streaming through memory once per peer (a 2 MiB block of a 16 MiB all_reduce, 8 ranks). Every element still
sees the same operations in the same order, so the bits are those of the unchunked loop. Runs whose only
source in this rank's own memory is the first transfer, and that one reads either the region itself or
memory apart from it, are chunked; anything else runs transfer by transfer.

Consecutive ones that copy the same source region to several places (a push: ``mesh.push_broadcast_phase``) run
chunk by chunk the other way round: one chunk of the source to every destination, then the next, so the source
is read from memory once (two threads copying 16 MiB to 7 places on the 2-core laptop: 7.7 instead of 9.6 ms).
Copies give the same bits in any order; a destination overlapping the source or another destination runs
transfer by transfer.

The barriers between steps are the caller's (the card's endpoint, or the host's wait with its hand-over).
"""

from __future__ import annotations

import threading

import numpy as np

from rt import copytune

from ..types import apply_reduce

CHUNK_BYTES = 128 << 10
FAN_OUT_BYTES = 512 << 10       # a fan-out's chunk: read into the core's cache once, written everywhere


def plan(sched, rank: int) -> list:
    """Per step, ``rank``'s transfers (with their index in the step) in runs writing one region or copying one
    source region (``FAN_OUT`` first), computed once per (schedule, rank) and kept on the schedule (schedules
    are built once per signature and shared)."""
    plans = sched.__dict__.setdefault("_plans", {})    # a frozen dataclass: its hash walks every transfer
    out = plans.get(rank)
    if out is None:
        out = []
        for step in sched.steps:
            runs: list[list] = []
            for i, t in enumerate(step):
                if t.runner != rank or not t.count:
                    continue
                last = runs[-1][-1][1] if runs else None
                if last is None:
                    runs.append([(i, t)])
                elif runs[-1][0] is not FAN_OUT and (t.dst, t.dst_buf, t.dst_off, t.count) == \
                        (last.dst, last.dst_buf, last.dst_off, last.count):
                    runs[-1].append((i, t))
                elif _copies_of(last, t) and (len(runs[-1]) == 1 or runs[-1][0] is FAN_OUT):
                    if runs[-1][0] is not FAN_OUT:
                        runs[-1].insert(0, FAN_OUT)
                    runs[-1].append((i, t))
                else:
                    runs.append([(i, t)])
            out.append([tuple(r) for r in runs])
        plans[rank] = out
    return out


FAN_OUT = "fan-out"        # the mark of a run copying one source region to several places


def _copies_of(a, b) -> bool:
    """Two plain copies of the same source region."""
    return not a.reduce and not b.reduce and (a.src, a.src_buf, a.src_off, a.count) == \
        (b.src, b.src_buf, b.src_off, b.count)


def run_step(sched, si: int, rank: int, arrays, rop: int, fetched=None) -> None:
    """Execute ``rank``'s transfers of step ``si`` of ``sched`` (see the module docstring for the order).

    ``arrays[r][buf]`` is rank r's buffer as a typed array; ``fetched`` maps a transfer's index in the step to
    data already brought from another node (``hccl/card/collective.py``), read instead of ``arrays``.
    """
    for run in plan(sched, rank)[si]:
        if run[0] is FAN_OUT:
            _fan_out(run[1:], arrays, fetched)
            continue
        srcs, dsts = [], []
        for i, t in run:
            srcs.append(fetched[i] if fetched and i in fetched else
                        arrays[t.src][t.src_buf][t.src_off: t.src_off + t.count])
            dsts.append(arrays[t.dst][t.dst_buf][t.dst_off: t.dst_off + t.count])
        dst = dsts[0]
        step = max(1, CHUNK_BYTES // max(dst.itemsize, 1))
        if len(run) == 1 or dst.size <= step or not _chunkable(run, srcs, dst, rank):
            for (_, t), src, d in zip(run, srcs, dsts):
                _one(t, rop, d, src)
            continue
        for lo in range(0, dst.size, step):
            hi = lo + step
            d = dst[lo:hi]
            for (_, t), src in zip(run, srcs):
                _one(t, rop, d, src[lo:hi])


def _fan_out(run, arrays, fetched) -> None:
    """Copies of one source region: chunk by chunk, each chunk to every destination (see the module docstring)."""
    i0, t0 = run[0]
    src = fetched[i0] if fetched and i0 in fetched else arrays[t0.src][t0.src_buf][t0.src_off: t0.src_off + t0.count]
    dsts = [arrays[t.dst][t.dst_buf][t.dst_off: t.dst_off + t.count] for _, t in run]
    dsts = [d for d in dsts if d.ctypes.data != src.ctypes.data]       # in-place calls: a region onto itself
    step = max(1, FAN_OUT_BYTES // max(src.itemsize, 1))
    apart = all(not np.may_share_memory(d, x) for k, d in enumerate(dsts) for x in [src, *dsts[k + 1:]])
    if src.size <= step or not apart:
        for d in dsts:
            np.copyto(d, src)
        return
    nt = _nt_bytes()
    for lo in range(0, src.size, step):
        s = src[lo: lo + step]
        at, bounced = s.ctypes.data, {}              # page offset -> this chunk there
        for d in dsts:
            d = d[lo: lo + step]
            if nt and s.nbytes >= nt and 0 < (d.ctypes.data - at) % PAGE < ALIAS_BAND:
                page = d.ctypes.data % PAGE
                if page not in bounced:
                    bounced[page] = _bounce(s, page, nt)
                np.copyto(d, bounced[page])
            else:
                np.copyto(d, s)


PAGE = 4096
# glibc's non-temporal copy runs at a fifth of its speed (4 instead of 21 GB/s on the 2-core laptop) when the
# destination is less than this far ahead of the source within a page: its loads and stores alias (4K aliasing).
# A card's blocks are 512-byte multiples (``rt/card/blocks.py``), so a receive buffer often sits 512 bytes
# ahead of a send buffer (the out-of-place all_gather of hccl-test): such a chunk is first copied, in cache,
# to a buffer at the destination's page offset, and written from there.
ALIAS_BAND = 1024
_local = threading.local()
_nt = None


def _nt_bytes() -> int:
    """From how many bytes this process's copies use non-temporal stores (``rt/copytune.py``; 0: never)."""
    global _nt
    if _nt is None:
        _nt = copytune.active()
    return _nt


def _bounce(chunk: np.ndarray, page: int, nt: int) -> np.ndarray:
    """``chunk`` copied into this thread's buffer for page offset ``page``, in pieces below ``nt`` (so the copy
    stays in the cache)."""
    bufs = _local.__dict__.setdefault("bufs", {})
    buf = bufs.get(page)
    if buf is None or buf.nbytes < chunk.nbytes + PAGE:
        if len(bufs) >= 8:
            bufs.clear()
        buf = bufs[page] = np.empty(chunk.nbytes + PAGE, np.uint8)
    start = (page - buf.ctypes.data) % PAGE
    out = buf[start: start + chunk.nbytes].view(chunk.dtype)
    piece = max(1, nt // 2 // chunk.itemsize)
    for lo in range(0, out.size, piece):
        np.copyto(out[lo: lo + piece], chunk[lo: lo + piece])
    return out


def _one(t, rop: int, dst: np.ndarray, src: np.ndarray) -> None:
    if t.reduce:
        apply_reduce(rop, dst, src)
    elif dst.ctypes.data != src.ctypes.data:      # in-place calls: a region onto itself
        np.copyto(dst, src)


def _chunkable(run, srcs, dst, rank: int) -> bool:
    """Chunk by chunk gives the same result: no transfer but the first reads this rank's own memory, and the
    first reads the region itself or memory apart from it (a chunk never reads what an earlier chunk wrote)."""
    for k, ((_, t), src) in enumerate(zip(run, srcs)):
        if t.src == rank and (k or (src.ctypes.data != dst.ctypes.data and np.may_share_memory(src, dst))):
            return False
    return True
