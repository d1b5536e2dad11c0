"""``ProcessGroupHCCL``: the c10d backend registered as ``"hccl"``, running torch's collectives on npusim cards.

``init_process_group("hccl")`` (``env://``, ``tcp://``, a store; under ``launch``, ``torchrun`` or by hand)
creates one per group: the rank's card is ``torch.npu.set_device``'s, else ``LOCAL_RANK``'s; group rank 0
creates an HCCL communicator and shares its root info through the c10d store, every rank joins it
(``hccl.comm_init_root_info_config``, with the group's timeout as HCCL's execution timeout). Each collective
copies the tensors into card memory, runs npusim's HCCL there and copies the result back — so npusim's
checks apply to torch programs too: a rank that calls a different collective, count or dtype is named, a
rank that exited fails its peers' next collective within a second (``EI0002`` ... ``rank 1 is gone``).
"""

from __future__ import annotations

import datetime
import itertools
import threading
import weakref

import torch
import torch.distributed as dist

import hccl
import rt

from . import bootstrap
from .tensors import check, download, hccl_dtype, reduce_op, same_as, single, upload
from .work import Executor, Work

BACKEND = "hccl"
ROOT_KEY = "npusim/hccl_root_info"
_groups: "weakref.WeakSet[ProcessGroupHCCL]" = weakref.WeakSet()
_tags = itertools.count()


class ProcessGroupHCCL(dist.ProcessGroup):
    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self.timeout = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        self.group_tag = f"hccl-{next(_tags)}"
        bootstrap.ensure_runtime(store, rank, size, self.timeout)
        self.device = bootstrap.bind()
        self.ctx = rt.get_context()
        if rank == 0:
            store.set(ROOT_KEY, hccl.get_root_info().to_bytes())
        root = store.get(ROOT_KEY)
        self.comm = hccl.comm_init_root_info_config(size, root, rank, {"exec_timeout": self.timeout})
        self._seq = itertools.count(1)
        self._main = Executor(self.ctx, f"hccl-{self.group_tag}")
        self._p2p: dict[tuple[str, int], Executor] = {}
        self._p2p_lock = threading.Lock()
        _groups.add(self)

    # -- plumbing ------------------------------------------------------------------------------------
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:                         # noqa: N802 - c10d's name
        return BACKEND

    def _submit(self, op: str, result: list, fn, executor: Executor | None = None) -> Work:
        work = Work(self, op, next(self._seq), result, self.timeout)
        return (executor or self._main).submit(work, fn)

    def _peer_executor(self, direction: str, peer: int) -> Executor:
        if not isinstance(peer, int) or not 0 <= peer < self._size or peer == self._rank:
            raise ValueError(f"hccl {direction}: peer rank {peer!r} must be another rank of the group [0, {self._size})")
        with self._p2p_lock:
            ex = self._p2p.get((direction, peer))
            if ex is None:
                ex = self._p2p[(direction, peer)] = Executor(self.ctx, f"hccl-{self.group_tag}-{direction}-{peer}")
            return ex

    def drain(self, timeout: float) -> bool:
        return all(ex.drain(timeout) for ex in [self._main, *self._p2p.values()])

    def shutdown(self) -> None:
        for ex in [self._main, *self._p2p.values()]:
            ex.stop()
        try:
            hccl.comm_destroy(self.comm)
        except rt.NpuError:
            pass
        _groups.discard(self)

    def abort(self) -> None:
        self.shutdown()

    # -- reductions ------------------------------------------------------------------------------------
    def _reduce_into(self, ex, t: torch.Tensor, rop, root=None) -> None:
        code, average = reduce_op(rop, t, "all_reduce" if root is None else "reduce")
        ptr = upload(ex, "in", [t])
        if root is None:
            hccl.all_reduce(ptr, ptr, t.numel(), hccl_dtype(t, "all_reduce"), code, self.comm, ex.stream)
        else:
            hccl.reduce(ptr, ptr, t.numel(), hccl_dtype(t, "reduce"), code, root, self.comm, ex.stream)
        if root is None or root == self._rank:
            download(ex, ptr, [t])
            if average:
                t.div_(self._size)
        else:
            rt.synchronize_stream(ex.stream)

    def allreduce(self, tensors, opts=None) -> Work:
        t = single(tensors, "all_reduce")
        rop = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        reduce_op(rop, t, "all_reduce")
        return self._submit("all_reduce", [t], lambda ex: self._reduce_into(ex, t, rop))

    def allreduce_coalesced(self, tensors, opts=None) -> Work:
        tensors = [check(t, "all_reduce_coalesced", f"tensors[{i}]") for i, t in enumerate(tensors)]
        rop = opts.reduceOp if opts is not None else dist.ReduceOp.SUM

        def run(ex):
            for t in tensors:
                self._reduce_into(ex, t, rop)
        return self._submit("all_reduce_coalesced", tensors, run)

    def reduce(self, tensors, opts=None) -> Work:
        t = single(tensors, "reduce")
        root = self._root(opts, "reduce")
        rop = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        reduce_op(rop, t, "reduce")
        return self._submit("reduce", [t], lambda ex: self._reduce_into(ex, t, rop, root))

    def _root(self, opts, op) -> int:
        root = opts.rootRank if opts is not None else 0
        if not 0 <= root < self._size:
            raise ValueError(f"hccl {op}: root rank {root} is outside the group [0, {self._size})")
        return root

    def broadcast(self, tensors, opts=None) -> Work:
        t = single(tensors, "broadcast")
        root = self._root(opts, "broadcast")

        def run(ex):
            ptr = upload(ex, "in", [t]) if self._rank == root else ex.buffer("in", t.numel() * t.element_size())
            hccl.broadcast(ptr, t.numel(), hccl_dtype(t, "broadcast"), root, self.comm, ex.stream)
            if self._rank != root:
                download(ex, ptr, [t])
            else:
                rt.synchronize_stream(ex.stream)
        return self._submit("broadcast", [t], run)

    # -- gathers and scatters ------------------------------------------------------------------------------
    def _all_gather(self, ex, inp: torch.Tensor, outs) -> None:
        n = inp.numel() * inp.element_size()
        send = upload(ex, "in", [inp])
        recv = ex.buffer("out", n * self._size)
        hccl.all_gather(send, recv, inp.numel(), hccl_dtype(inp, "all_gather"), self.comm, ex.stream)
        if outs is None:
            rt.synchronize_stream(ex.stream)
        else:
            download(ex, recv, outs)

    def allgather(self, output_tensors, input_tensors, opts=None) -> Work:
        inp = single(input_tensors, "all_gather")
        outs = same_as(single_list(output_tensors, "all_gather"), inp, self._size, "all_gather", "output_tensor_list")
        return self._submit("all_gather", [outs], lambda ex: self._all_gather(ex, inp, outs))

    def all_gather_single(self, output, input, opts=None) -> Work:   # noqa: A002 - c10d's names
        inp, out = check(input, "all_gather_into_tensor", "input"), check(output, "all_gather_into_tensor", "output")
        _sizes(out, inp, self._size, "all_gather_into_tensor")
        return self._submit("all_gather_into_tensor", [out], lambda ex: self._all_gather(ex, inp, [out]))

    _allgather_base = all_gather_single

    def gather(self, output_tensors, input_tensors, opts=None) -> Work:
        inp = single(input_tensors, "gather")
        root = self._root(opts, "gather")
        outs = None
        if self._rank == root:
            outs = same_as(single_list(output_tensors, "gather"), inp, self._size, "gather", "gather_list")
        return self._submit("gather", [outs or []], lambda ex: self._all_gather(ex, inp, outs))

    def _reduce_scatter(self, ex, ins, out, rop) -> None:
        code, average = reduce_op(rop, out, "reduce_scatter")
        send = upload(ex, "in", ins)
        recv = ex.buffer("out", out.numel() * out.element_size())
        hccl.reduce_scatter(send, recv, out.numel(), hccl_dtype(out, "reduce_scatter"), code, self.comm, ex.stream)
        download(ex, recv, [out])
        if average:
            out.div_(self._size)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None) -> Work:
        out = single(output_tensors, "reduce_scatter")
        ins = same_as(single_list(input_tensors, "reduce_scatter"), out, self._size, "reduce_scatter", "input_list")
        rop = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        reduce_op(rop, out, "reduce_scatter")
        return self._submit("reduce_scatter", [out], lambda ex: self._reduce_scatter(ex, ins, out, rop))

    def reduce_scatter_single(self, output, input, opts=None) -> Work:   # noqa: A002
        out, inp = check(output, "reduce_scatter_tensor", "output"), check(input, "reduce_scatter_tensor", "input")
        _sizes(inp, out, self._size, "reduce_scatter_tensor")
        rop = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        reduce_op(rop, out, "reduce_scatter_tensor")
        return self._submit("reduce_scatter_tensor", [out], lambda ex: self._reduce_scatter(ex, [inp], out, rop))

    _reduce_scatter_base = reduce_scatter_single

    def scatter(self, output_tensors, input_tensors, opts=None) -> Work:
        out = single(output_tensors, "scatter")
        root = self._root(opts, "scatter")
        ins = same_as(single_list(input_tensors, "scatter"), out, self._size, "scatter", "scatter_list") \
            if self._rank == root else []

        def run(ex):
            n = out.numel() * out.element_size()
            send = upload(ex, "in", ins) if ins else 0
            recv = ex.buffer("out", n)
            hccl.scatter(send, recv, out.numel(), hccl_dtype(out, "scatter"), root, self.comm, ex.stream)
            download(ex, recv, [out])
        return self._submit("scatter", [out], run)

    # -- all to all ------------------------------------------------------------------------------------------
    def _all_to_all(self, ex, ins, outs, send_counts, recv_counts, code) -> None:
        sdispls = [sum(send_counts[:i]) for i in range(self._size)]
        rdispls = [sum(recv_counts[:i]) for i in range(self._size)]
        send = upload(ex, "in", ins)
        recv = ex.buffer("out", max(sum(t.numel() * t.element_size() for t in outs), 1))
        hccl.all_to_all_v(send, send_counts, sdispls, code, recv, recv_counts, rdispls, code, self.comm, ex.stream)
        download(ex, recv, outs)

    def alltoall(self, output_tensors, input_tensors, opts=None) -> Work:
        ins = [check(t, "all_to_all", f"input_tensor_list[{i}]") for i, t in enumerate(input_tensors)]
        outs = [check(t, "all_to_all", f"output_tensor_list[{i}]") for i, t in enumerate(output_tensors)]
        if len(ins) != self._size or len(outs) != self._size:
            raise ValueError(f"hccl all_to_all: input and output lists need one tensor per rank ({self._size}), "
                             f"got {len(ins)} and {len(outs)}")
        if len({t.dtype for t in ins + outs}) != 1:
            raise ValueError(f"hccl all_to_all: all tensors must have one dtype, got {sorted({str(t.dtype) for t in ins + outs})}")
        code = hccl_dtype(ins[0], "all_to_all")
        return self._submit("all_to_all", outs, lambda ex: self._all_to_all(
            ex, ins, outs, [t.numel() for t in ins], [t.numel() for t in outs], code))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None) -> Work:  # noqa: A002
        out, inp = check(output, "all_to_all_single", "output"), check(input, "all_to_all_single", "input")
        if out.dtype != inp.dtype:
            raise ValueError(f"hccl all_to_all_single: output is {out.dtype}, input is {inp.dtype}")
        send = _splits(inp, input_split_sizes, self._size, "input_split_sizes")
        recv = _splits(out, output_split_sizes, self._size, "output_split_sizes")
        code = hccl_dtype(inp, "all_to_all_single")
        return self._submit("all_to_all_single", [out], lambda ex: self._all_to_all(ex, [inp], [out], send, recv, code))

    alltoall_base = all_to_all_single

    # -- point to point and barrier --------------------------------------------------------------------------
    def send(self, tensors, dstRank, tag=0) -> Work:          # noqa: N803 - c10d's names
        t = single(tensors, "send")
        ex = self._peer_executor("send", dstRank)

        def run(ex):
            ptr = upload(ex, "in", [t])
            hccl.send(ptr, t.numel(), hccl_dtype(t, "send"), dstRank, self.comm, ex.stream)
            rt.synchronize_stream(ex.stream)
        return self._submit("send", [t], run, ex)

    def recv(self, tensors, srcRank, tag=0) -> Work:          # noqa: N803
        t = single(tensors, "recv")
        ex = self._peer_executor("recv", srcRank)

        def run(ex):
            ptr = ex.buffer("in", t.numel() * t.element_size())
            hccl.recv(ptr, t.numel(), hccl_dtype(t, "recv"), srcRank, self.comm, ex.stream)
            download(ex, ptr, [t])
        return self._submit("recv", [t], run, ex)

    def recv_anysource(self, tensors, tag=0) -> Work:
        raise RuntimeError("hccl recv: receiving from any source is not supported (HCCL has no wildcard recv); "
                           "pass src")

    def barrier(self, opts=None) -> Work:
        def run(ex):
            hccl.barrier(self.comm, ex.stream)
            rt.synchronize_stream(ex.stream)
        return self._submit("barrier", [], run)

    def __repr__(self) -> str:
        return f"ProcessGroupHCCL(rank={self._rank}, size={self._size}, card={self.device})"


def single_list(tensor_lists, op: str) -> list:
    """The one inner list of a c10d list-of-lists argument."""
    if not isinstance(tensor_lists, (list, tuple)) or len(tensor_lists) != 1:
        raise ValueError(f"hccl {op}: expecting exactly one tensor list")
    return tensor_lists[0]


def _sizes(big: torch.Tensor, small: torch.Tensor, n: int, op: str) -> None:
    if big.dtype != small.dtype or big.numel() != small.numel() * n:
        raise ValueError(f"hccl {op}: the large tensor ({big.dtype}[{big.numel()}]) must hold group size ({n}) times "
                         f"the small one ({small.dtype}[{small.numel()}])")


def _splits(t: torch.Tensor, splits, n: int, what: str) -> list[int]:
    """Element counts per rank from dim-0 split sizes (even when empty)."""
    rows = t.shape[0] if t.dim() else 1
    per_row = t.numel() // rows if rows else 0
    if not splits:
        if rows % n:
            raise ValueError(f"hccl all_to_all_single: dim 0 ({rows}) is not divisible by the group size ({n})")
        return [rows // n * per_row] * n
    splits = [int(s) for s in splits]
    if len(splits) != n or sum(splits) != rows or min(splits) < 0:
        raise ValueError(f"hccl all_to_all_single: {what} {splits} must be {n} sizes summing to dim 0 ({rows})")
    return [s * per_row for s in splits]


def wait_all_groups(timeout: float = 1836.0) -> None:
    """torch.npu.synchronize: every group's outstanding work of this process has finished."""
    for pg in list(_groups):
        pg.drain(timeout)


def _create(store, rank, size, timeout):
    return ProcessGroupHCCL(store, rank, size, timeout)


def register() -> None:
    """Register the backend (idempotent): ``init_process_group("hccl")``."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create, devices=["npu", "cpu"])

