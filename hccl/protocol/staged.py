"""Small collectives in one barrier, through per-rank staging areas of the control block.

Every rank copies its input into its staging area for the call's sequence parity (double-buffered),
publishes its fingerprint, arrives at the node barrier; after it every rank computes its own result
from all the stages. Run by cards (``_staged`` in ``hccl/card/collective.py``) or by a rank's own process
(``hccl/hostpath.py``) — both follow exactly this protocol on the same block, so they interoperate. Across
nodes the ranks stage the same way but one card per node combines and crosses nodes for them
(``hccl/protocol/nodestaged.py``: one partial sum per node for a reduction); ``fits_stage`` decides, alike on
every rank.
"""

from __future__ import annotations

import numpy as np

from ..types import hccl_np_dtype, reduce_ufunc
from .ctrlblock import ARRIVED, RESULT_BYTES, STAGE_BYTES, ControlBlock

HUB_STAGE_BYTES = RESULT_BYTES                 # across nodes: the most one frame (and a node's result area) carries
STAGED = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "scatter", "all_to_all", "barrier")


def staged_bytes(op: str, p: dict, n: int, dtype) -> int:
    """Bytes one rank stages for a small collective (its whole input)."""
    c = p["count"] * dtype.itemsize
    return c * n if op in ("reduce_scatter", "scatter", "all_to_all") else c


def hub_frame_bytes(op: str, nbytes: int, n: int) -> int:
    """Bytes of the largest frame of a small collective across nodes (``hccl/transport/direct.py``), given
    ``nbytes`` staged per rank: a reduction sends one partial sum of a rank's size each way, a broadcast or
    scatter the root's input alone; all_gather and all_to_all carry every rank's input."""
    return nbytes * n if op in ("all_gather", "all_to_all") else nbytes


def fits_stage(op: str, p: dict, n: int, across_nodes: bool = False) -> bool:
    """A collective the staged path runs: a staged op, no HCCL_ALGO, input ≤ STAGE_BYTES per rank; across
    nodes (one round through the groups' leaders) also its largest frame ≤ HUB_STAGE_BYTES — so an all_reduce
    of up to 256 KiB a rank takes one round at any world size, an all_gather only while all inputs fit 1 MiB."""
    if op not in STAGED or p.get("algo"):
        return False
    nbytes = staged_bytes(op, p, n, hccl_np_dtype(p["dtype"]))
    if nbytes > STAGE_BYTES:
        return False
    return not across_nodes or hub_frame_bytes(op, nbytes, n) <= HUB_STAGE_BYTES


def stage_source(op: str, p: dict, rank: int) -> str | None:
    """Which of this rank's buffers it stages (None: it contributes nothing, e.g. a non-root broadcast)."""
    if op in ("broadcast", "scatter") and rank != p.get("root"):
        return None
    return "recv" if op == "broadcast" else "send"


def stage_in(ctrl: ControlBlock, rank: int, seq: int, fingerprint: str, data: np.ndarray | None) -> int:
    """Copy ``data`` (uint8) into this rank's stage for ``seq``, publish the call, arrive at the barrier.
    Returns the barrier phase to wait for."""
    if data is not None:
        ctrl.stage(rank, seq % 2)[:data.size] = data
    ctrl.set_fingerprint(rank, seq, fingerprint)
    ctrl.slots[rank, ARRIVED] = seq
    return ctrl.arrive(rank)


def stage_agrees(ctrl: ControlBlock, seq: int) -> bool:
    """Every rank called the same collective as ``seq`` (after the barrier): one comparison of the
    length-prefixed fingerprint bytes of all slots."""
    return ctrl.fingerprints_equal(seq)


def stage_out(ctrl: ControlBlock, rank: int, seq: int, op: str, p: dict, recv: np.ndarray | None) -> None:
    """This rank's result of small collective ``seq`` from every rank's stage, into ``recv`` (uint8)."""
    parity = seq % 2
    combine_stages(lambda k: ctrl.stage(k, parity), ctrl.n, rank, op, p, recv)


def numpy_number(dtype) -> bool:
    """Whether numpy's own ufunc loops reduce ``dtype`` (its ints and floats; not ml_dtypes' bf16 and fp8)."""
    return dtype.kind in "iuf" and type(dtype).__module__ == "numpy.dtypes"


def stage_rows(ctrl: ControlBlock, parity: int, first_rank: int, ranks: int, dtype, first: int, items: int):
    """Elements ``first`` … ``first + items - 1`` of the stages (of ``parity``) of ranks ``first_rank`` …
    ``first_rank + ranks - 1``, as one (ranks, items) array: a ufunc's reduce along axis 0 runs rank after rank,
    as :func:`combine_stages` does, so the same bits in one call."""
    return np.ndarray((ranks, items), dtype, buffer=ctrl.raw,
                      offset=ctrl.stage_base + (2 * first_rank + parity) * STAGE_BYTES + first * dtype.itemsize,
                      strides=(2 * STAGE_BYTES, dtype.itemsize))


def fast_reduce(ctrl: ControlBlock, rank: int, op: str, p: dict):
    """For a reduction (all_reduce, reduce, reduce_scatter) of a numpy number type on one node: a function
    ``(parity, recv)`` computing what :func:`stage_out` computes — rank by rank, in the output dtype, so the
    same bits — in one ufunc call over a strided view of every rank's stage; None for anything else."""
    if op not in ("all_reduce", "reduce", "reduce_scatter"):
        return None
    dtype = hccl_np_dtype(p["dtype"])
    if not numpy_number(dtype):
        return None
    count = p["count"]
    first = rank * count if op == "reduce_scatter" else 0
    stages = [stage_rows(ctrl, parity, 0, ctrl.n, dtype, first, count) for parity in (0, 1)]
    return FastReduce(reduce_ufunc(p.get("op", 0)).reduce, stages, dtype)


class FastReduce:
    """:func:`fast_reduce`'s function: ``combine(stages[parity], axis=0, out=recv.view(dtype))``. Its parts are
    attributes, so a hot caller that keeps the typed view of its ``recv`` makes that one ufunc call itself."""

    __slots__ = ("combine", "stages", "dtype")

    def __init__(self, combine, stages: list, dtype: np.dtype):
        self.combine, self.stages, self.dtype = combine, stages, dtype

    def __call__(self, parity: int, recv: np.ndarray | None) -> None:
        if recv is not None:
            self.combine(self.stages[parity], axis=0, out=recv.view(self.dtype))


SPLIT_BYTES = 64 << 10        # an all_reduce of this many bytes a rank or more is reduced in two phases (split)


def split_reduce(op: str, p: dict, n: int) -> bool:
    """Whether a staged all_reduce takes two barriers instead of one: after the first each rank reduces only
    its own block (``block``) of every rank's stage, into its result and back into its stage; after the
    second it copies the other ranks' reduced blocks from their stages. Every rank reads about 2 inputs'
    worth instead of n: from 64 KiB a rank that saves more than the second barrier costs."""
    return op == "all_reduce" and n > 1 and p["count"] * hccl_np_dtype(p["dtype"]).itemsize >= SPLIT_BYTES


def block(count: int, n: int, rank: int) -> tuple[int, int]:
    """The elements rank ``rank`` reduces in a split all_reduce of ``count``: (first, how many)."""
    first, end = rank * count // n, (rank + 1) * count // n
    return first, end - first


def split_own(stage_of, n: int, rank: int, p: dict, recv: np.ndarray) -> None:
    """Phase 1 of a split all_reduce: this rank's block of every stage, reduced rank by rank in the output
    dtype (the bits :func:`combine_stages` gives), into ``recv`` (uint8) and into this rank's own stage."""
    dtype = hccl_np_dtype(p["dtype"])
    first, items = block(p["count"], n, rank)
    if not items:
        return
    lo, hi = first * dtype.itemsize, (first + items) * dtype.itemsize
    out = recv[lo:hi].view(dtype)
    combine = reduce_ufunc(p.get("op", 0))
    np.copyto(out, stage_of(0)[lo:hi].view(dtype))
    for k in range(1, n):
        combine(out, stage_of(k)[lo:hi].view(dtype), out=out, casting="unsafe")
    np.copyto(stage_of(rank)[lo:hi], recv[lo:hi])


def split_gather(stage_of, n: int, rank: int, p: dict, recv: np.ndarray) -> None:
    """Phase 2 of a split all_reduce: every other rank's reduced block, from its stage into ``recv`` (uint8)."""
    itemsize = hccl_np_dtype(p["dtype"]).itemsize
    for k in range(n):
        if k != rank:
            first, items = block(p["count"], n, k)
            lo, hi = first * itemsize, (first + items) * itemsize
            np.copyto(recv[lo:hi], stage_of(k)[lo:hi])


def fast_split(ctrl: ControlBlock, rank: int, p: dict):
    """For a split all_reduce of a numpy number type: ``(own(parity, recv), gather(parity, recv))`` doing what
    :func:`split_own` and :func:`split_gather` do, the reduction one ufunc call over a strided view of every
    rank's block (axis 0 runs rank after rank: the same bits); None for other types."""
    dtype = hccl_np_dtype(p["dtype"])
    if not numpy_number(dtype):
        return None
    n, count, itemsize = ctrl.n, p["count"], dtype.itemsize
    first, items = block(count, n, rank)
    lo, hi = first * itemsize, (first + items) * itemsize
    stages = [stage_rows(ctrl, parity, 0, n, dtype, first, items) for parity in (0, 1)]
    mine = [ctrl.stage(rank, parity)[lo:hi] for parity in (0, 1)]
    bounds = [(k, block(count, n, k)) for k in range(n) if k != rank]
    # per parity: (where in recv, the owner's stage block) of every other rank's reduced block
    theirs = [[(f * itemsize, (f + m) * itemsize, ctrl.stage(k, parity)[f * itemsize: (f + m) * itemsize])
               for k, (f, m) in bounds] for parity in (0, 1)]
    combine = reduce_ufunc(p.get("op", 0)).reduce

    def own(parity: int, recv: np.ndarray) -> None:
        if items:
            combine(stages[parity], axis=0, out=recv[lo:hi].view(dtype))
            np.copyto(mine[parity], recv[lo:hi])

    def gather(parity: int, recv: np.ndarray) -> None:
        for k_lo, k_hi, src in theirs[parity]:
            np.copyto(recv[k_lo:k_hi], src)
    return own, gather


def combine_stages(stage_of, n: int, rank: int, op: str, p: dict, recv: np.ndarray | None) -> None:
    """This rank's result of a small collective into ``recv`` (uint8), from ``stage_of(k)``: the bytes
    rank k staged (its input; empty for ranks that contribute nothing)."""
    if op == "barrier" or recv is None:
        return
    count, root = p["count"], p.get("root")
    dtype = hccl_np_dtype(p["dtype"])
    itemsize = dtype.itemsize
    out = recv.view(dtype)

    def stage(k, first=0, items=count):
        return stage_of(k)[first * itemsize: (first + items) * itemsize].view(dtype)
    if op in ("all_reduce", "reduce", "reduce_scatter"):
        first = rank * count if op == "reduce_scatter" else 0
        combine = reduce_ufunc(p.get("op", 0))
        np.copyto(out, stage(0, first))
        for k in range(1, n):          # in the output dtype, rank by rank: as apply_reduce, as the card does
            combine(out, stage(k, first), out=out, casting="unsafe")
    elif op == "broadcast":
        if rank != root:
            np.copyto(out, stage(root))
    elif op == "scatter":
        np.copyto(out, stage(root, rank * count))
    elif op == "all_gather":
        for k in range(n):
            np.copyto(out[k * count: (k + 1) * count], stage(k))
    elif op == "all_to_all":
        for k in range(n):
            np.copyto(out[k * count: (k + 1) * count], stage(k, rank * count))
