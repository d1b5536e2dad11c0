"""``ProcessGroupHCCL``: the c10d backend registered as ``"hccl"``, running torch's collectives on npusim cards.

``init_process_group("hccl")`` (``env://``, ``tcp://``, a store; under ``launch``, ``torchrun``,
``torch.multiprocessing`` or by hand) creates one per group: the rank's card is ``torch.npu.set_device``'s, else
``LOCAL_RANK``'s; group rank 0 creates an HCCL communicator and shares its root info through the c10d store,
every rank joins it (``hccl.comm_init_root_info_config``, with the group's timeout as HCCL's execution timeout).

The group serves ``npu`` tensors only: a call on CPU tensors goes to the group's gloo (``"cpu:gloo,npu:hccl"``)
or fails with c10d's ``No backend type associated with device type cpu`` (``routing.py``). Each method takes the
argument forms torch_npu's ProcessGroupHCCL takes and refuses what it refuses, with its exception types and texts
(``checks.py``), in the calling thread; the collective itself then runs in the group's
executor (``collectives.py``): the tensors are copied into card memory, npusim's HCCL runs there and the result
is copied back — so npusim's checks apply to torch programs too: a rank that calls a different collective, count
or dtype is named, a rank that exited fails its peers' next collective within a second (``EI0002`` ... ``rank 1
is gone``).
"""

from __future__ import annotations

import datetime
import inspect
import itertools
import threading
import warnings
import weakref

import torch
import torch.distributed as dist

import hccl
import rt
from rt.diag.recorder import RECORDER

from . import bootstrap, checks, routing
from . import collectives as run
from .options import Options, checked as checked_options
from .errors import NOT_SUPPORT, PARAM, TYPE, fail
from .routing import npu_only
from .work import Executor, Work

RECORDER.add_torch()         # the call site of a collective is the user's line, not torch.distributed's

BACKEND = "hccl"
ROOT_KEY = "npusim/hccl_root_info"
_groups: weakref.WeakSet[ProcessGroupHCCL] = weakref.WeakSet()
_tags = itertools.count()


def _outside_dynamo(cls):
    """Keep torch.compile out of the group's methods, as it is out of a C++ ProcessGroup's: C++ callers (DDP's
    reducer broadcasting its bucket order, functional collectives) reach them through c10d's Python trampoline
    while dynamo's frame hook is set, and dynamo would trace them as new frames (``torch._disable_dynamo``: run
    eagerly, dynamo imported lazily at the first call)."""
    for name, value in list(vars(cls).items()):
        if inspect.isfunction(value) and (not name.startswith("_") or name in _C10D_PRIVATE):
            setattr(cls, name, torch._disable_dynamo(value))
    return cls


_C10D_PRIVATE = {"_allgather_base", "_reduce_scatter_base", "_get_backend"}


def _rop(opts):
    return opts.reduceOp if opts is not None else dist.ReduceOp.SUM


@_outside_dynamo
class ProcessGroupHCCL(dist.ProcessGroup):
    Options = Options

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta, pg_options=None):
        super().__init__(rank, size)
        self._options = checked_options(pg_options)
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
        self.self_channel = run.SelfChannel()
        self._seq = itertools.count(1)
        self._main = Executor(self.ctx, f"hccl-{self.group_tag}")
        self._p2p: dict[tuple[str, int], Executor] = {}
        self._p2p_lock = threading.Lock()
        self.other_backends = routing.OtherBackends(store, rank, size, self.timeout)
        self._name: str | None = None
        _groups.add(self)

    # -- plumbing ------------------------------------------------------------------------------------
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:
        return BACKEND

    supports_splitting = supports_coalescing = False

    # c10d's ProcessGroup keeps its name in its registered Backends (``ProcessGroup::setGroupName`` forwards to
    # each), and a Python ProcessGroup registers none; c10d's Python trampoline lets a subclass keep it instead
    # (its ``getGroupName``/``setGroupName``), which ``group_name``, ``_set_group_name`` and C++ callers all reach.
    # ``_new_process_group_helper`` sets it; DeviceMesh, functional collectives and dynamo read it.
    def getGroupName(self) -> str:
        if self._name is None:
            raise RuntimeError("ProcessGroup name not set")
        return self._name

    def setGroupName(self, name: str) -> None:
        self._name = name

    @property
    def options(self) -> Options:
        """The group's ``ProcessGroupHCCL.Options`` (``pg_options``, or the defaults)."""
        return self._options

    def get_hccl_comm_name(self, rankid: int, *args, init_comm: bool = True) -> str:
        """torch_npu's ``get_hccl_comm_name``: the name of the HCCL communicator serving ``rankid``'s device — the
        group's one communicator (one card per process), whose id npusim's HCCL names it by in its errors."""
        if not isinstance(rankid, int) or isinstance(rankid, bool):
            raise TypeError(f"get_hccl_comm_name(): rankid must be an int, not {type(rankid).__name__}")
        if rankid < 0:
            fail(f"Invalid rank {rankid}", PARAM)
        return self.comm.id

    @property
    def _device_types(self) -> list[torch.device]:
        """The device types c10d would have registered for this group: ``npu`` (and ``cpu`` for "cpu:gloo,...")."""
        return routing.device_types(self)

    def _get_backend(self, device: torch.device):
        """c10d's ``ProcessGroup::getBackend``: this group for ``npu``, its gloo for ``cpu`` where it has one."""
        kind = torch.device(device).type
        return self if kind == "npu" else self.other_backends.get(self, kind)

    def _submit(self, op: str, result: list, fn, executor: Executor | None = None) -> Work:
        work = Work(self, op, next(self._seq), result, self.timeout)
        if RECORDER.watching:           # the collective runs on the group's thread: hand it the user's line
            site = RECORDER.site(1)
            return (executor or self._main).submit(work, lambda ex: RECORDER.on_behalf(site, fn, self, ex))
        return (executor or self._main).submit(work, lambda ex: fn(self, ex))

    def _peer_executor(self, direction: str, peer: int) -> Executor:
        if not isinstance(peer, int) or not 0 <= peer < self._size:
            fail(f"Invalid {'destination' if direction == 'send' else 'source'} rank {peer!r}: the group has ranks "
                 f"[0, {self._size})", PARAM)
        with self._p2p_lock:
            ex = self._p2p.get((direction, peer))
            if ex is None:
                ex = self._p2p[(direction, peer)] = Executor(self.ctx, f"hccl-{self.group_tag}-{direction}-{peer}")
            return ex

    def _root(self, root: int) -> int:
        if not 0 <= root < self._size:
            fail(f"invalid root rank: {root}", PARAM)
        return root

    def drain(self, timeout: float) -> bool:
        return all(ex.drain(timeout) for ex in [self._main, *self._p2p.values()])

    def shutdown(self) -> None:
        for ex in [self._main, *self._p2p.values()]:
            ex.stop()
        self.other_backends.shutdown()
        try:
            hccl.comm_destroy(self.comm)
        except rt.NpuError:
            pass
        _groups.discard(self)

    def abort(self) -> None:
        self.shutdown()

    # -- reductions ------------------------------------------------------------------------------------
    def _reducible(self, t: torch.Tensor, rop, function: str) -> None:
        checks.dtype(t)
        if t.dtype not in (torch.bool, torch.uint8):               # reduced as int32 (torch_npu casts them)
            checks.reducible(t, function)
        checks.reduce_op(rop, t)

    @npu_only
    def allreduce(self, tensors, opts=None) -> Work:
        t, rop = checks.one_per_process(tensors), _rop(opts)
        self._reducible(t, rop, "allreduce")
        return self._submit("all_reduce", [t], lambda pg, ex: run.reduce(pg, ex, t, rop))

    @npu_only
    def allreduce_coalesced(self, tensors, opts=None) -> Work:
        tensors, rop = checks.same_device(tensors), _rop(opts)
        for t in tensors:
            self._reducible(t, rop, "allreduce_coalesced")

        def all_of_them(pg, ex):
            for t in tensors:
                run.reduce(pg, ex, t, rop)
        return self._submit("all_reduce_coalesced", tensors, all_of_them)

    @npu_only
    def reduce(self, tensors, opts=None) -> Work:
        t, rop = checks.one_per_process(tensors), _rop(opts)
        root = self._root(opts.rootRank if opts is not None else 0)
        self._reducible(t, rop, "reduce")
        return self._submit("reduce", [t], lambda pg, ex: run.reduce(pg, ex, t, rop, root))

    @npu_only
    def broadcast(self, tensors, opts=None) -> Work:
        t = checks.one_per_process(tensors)
        checks.dtype(t)
        root = self._root(opts.rootRank if opts is not None else 0)
        return self._submit("broadcast", [t], lambda pg, ex: run.broadcast(pg, ex, t, root))

    # -- gathers -------------------------------------------------------------------------------------------
    @npu_only
    def allgather(self, output_tensors, input_tensors, opts=None) -> Work:
        inp = checks.one_per_process(input_tensors)                # the input first, as ProcessGroupHCCL
        if len(output_tensors) != 1:
            fail("Tensor list operands to scatter/gather must have the same length", PARAM)
        outs = checks.same_device(output_tensors[-1])
        checks.dtype(inp)
        if all(o.numel() == outs[0].numel() for o in outs):
            checks.gather_list(outs, inp, self._size)
        else:                                                       # torch_npu's AllGatherV
            if len(outs) != self._size:
                fail("Tensor list input to scatter/gather must match number of collective participants", PARAM)
            if outs[0].device != inp.device:
                fail("Corresponding input/output tensors to scatter/gather must all reside on the same device",
                     PARAM)
            if outs[self._rank].numel() != inp.numel():
                fail(f"output tensor {self._rank} (this rank's) must have the input's {inp.numel()} elements, not "
                     f"{outs[self._rank].numel()}", PARAM)
        if outs[0].dtype != inp.dtype:
            fail("output tensor must have the same type as input tensor", PARAM)
        return self._submit("all_gather", [outs], lambda pg, ex: run.all_gather(pg, ex, inp, outs))

    def _gather_pair(self, output, input):
        """``all_gather_into_tensor``'s checks; the input and rank r's block of the output (row r, a view)."""
        if input.dtype != output.dtype:
            fail("output tensor must have the same type as input tensor", PARAM)
        if input.numel() * self._size != output.numel():
            fail("output tensor size must be equal to world_size times input tensor size", PARAM)
        inp, out = checks.one_per_process([input]), checks.one_per_process([output])
        checks.dtype(inp)
        return inp, list(out.reshape(self._size, inp.numel()).unbind(0))

    @npu_only
    def _allgather_base(self, output, input, opts=None) -> Work:
        inp, blocks = self._gather_pair(output, input)
        return self._submit("all_gather_into_tensor", [output], lambda pg, ex: run.all_gather(pg, ex, inp, blocks))

    all_gather_single = _allgather_base

    @npu_only
    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None) -> Work:
        """``_coalescing_manager``'s all_gather_into_tensor of several pairs: one ``Work`` for all of them."""
        if len(outputs) != len(inputs):
            fail("Tensor list operands to allgather_into_tensor_coalesced must have the same length", PARAM)
        pairs = [self._gather_pair(output, input) for output, input in zip(outputs, inputs)]

        def all_of_them(pg, ex):
            for inp, blocks in pairs:
                run.all_gather(pg, ex, inp, blocks)
        return self._submit("all_gather_into_tensor_coalesced", list(outputs), all_of_them)

    all_gather_single_coalesced = allgather_into_tensor_coalesced       # the name c10d's Python calls

    @npu_only
    def gather(self, output_tensors, input_tensors, opts=None) -> Work:
        root = opts.rootRank if opts is not None else 0
        if not 0 <= root < self._size:
            fail(f"ProcessGroupHCCL::gather: invalid root rank: {root}", PARAM, ValueError)
        inp = checks.one_per_process(input_tensors)
        checks.dtype(inp)
        outs = checks.root_list(output_tensors, inp, self._size, self._rank, root, "gather", "output")
        if self._rank == root:
            warnings.warn("HCCL doesn't support gather at the moment. Implemented with allgather instead.",
                          stacklevel=3)                               # the caller of routing's wrapper
        return self._submit("gather", [outs], lambda pg, ex: run.all_gather(pg, ex, inp, outs or None))

    # -- scatters ------------------------------------------------------------------------------------------
    @npu_only
    def reduce_scatter(self, output_tensors, input_tensors, opts=None) -> Work:
        out, rop = checks.one_per_process(output_tensors), _rop(opts)
        if len(input_tensors) != 1:
            fail("Tensor list operands to reduce_scatter must have the same length", PARAM)
        ins = checks.same_device(input_tensors[-1])
        checks.reduce_scatter_devices(ins, out)
        self._reducible_rs(ins[0], out, rop, "reduce_scatter")
        if len(ins) != self._size:
            fail("Tensor list input to scatter/gather must match number of collective participants", PARAM)
        if ins[self._rank].numel() != out.numel():                  # even, or torch_npu's ReduceScatterV
            fail(f"input tensor {self._rank} (this rank's) must have the output's {out.numel()} elements, not "
                 f"{ins[self._rank].numel()}", PARAM)
        return self._submit("reduce_scatter", [out], lambda pg, ex: run.reduce_scatter(pg, ex, ins, out, rop))

    def _scatter_pair(self, output, input, rop, function: str):
        """``reduce_scatter_tensor``'s checks; rank r's block of the input (row r, a view) and the output."""
        inp = checks.single(input)
        if input.dtype != output.dtype:
            fail("input tensor must be the same type as the output tensor.", TYPE)
        if input.numel() != output.numel() * self._size:
            fail("input tensor must be the same size as output size times world size", PARAM)
        out = checks.single(output)
        self._reducible_rs(inp, out, rop, function)
        return list(inp.reshape(self._size, out.numel()).unbind(0)), out

    @npu_only
    def _reduce_scatter_base(self, output, input, opts=None) -> Work:
        rop = _rop(opts)
        blocks, out = self._scatter_pair(output, input, rop, "_reduce_scatter_base")
        return self._submit("reduce_scatter_tensor", [out],
                            lambda pg, ex: run.reduce_scatter(pg, ex, blocks, out, rop))

    reduce_scatter_single = _reduce_scatter_base

    @npu_only
    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None) -> Work:
        """``_coalescing_manager``'s reduce_scatter_tensor of several pairs: one ``Work`` for all of them."""
        rop = _rop(opts)
        if len(outputs) != len(inputs):
            fail("Tensor list operands to reduce_scatter_tensor_coalesced must have the same length", PARAM)
        pairs = [self._scatter_pair(output, input, rop, "reduce_scatter_tensor_coalesced")
                 for output, input in zip(outputs, inputs)]

        def all_of_them(pg, ex):
            for blocks, out in pairs:
                run.reduce_scatter(pg, ex, blocks, out, rop)
        return self._submit("reduce_scatter_tensor_coalesced", list(outputs), all_of_them)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced  # the name c10d's Python calls

    def _reducible_rs(self, inp: torch.Tensor, out: torch.Tensor, rop, function: str) -> None:
        checks.reducible(inp, function)                             # no int32 detour for reduce_scatter
        checks.reduce_op(rop, inp)
        if out.dtype != inp.dtype:
            fail("input tensor must be the same type as the output tensor.", TYPE)

    @npu_only
    def scatter(self, output_tensors, input_tensors, opts=None) -> Work:
        root = opts.rootRank if opts is not None else 0
        if not 0 <= root < self._size:
            fail(f"ProcessGroupHCCL::scatter: invalid root rank: {root}", PARAM, ValueError)
        out = checks.one_per_process(output_tensors)
        checks.dtype(out)
        ins = checks.root_list(input_tensors, out, self._size, self._rank, root, "scatter", "input")
        return self._submit("scatter", [out], lambda pg, ex: run.scatter(pg, ex, ins, out, root))

    # -- all to all ------------------------------------------------------------------------------------------
    @npu_only
    def alltoall(self, output_tensors, input_tensors, opts=None) -> Work:
        if len(output_tensors) != self._size:
            fail("the size of output_tensors and worldsize must equal", PARAM)
        if len(output_tensors) != len(input_tensors):
            fail("the size of input_tensors and output_tensors must equal", PARAM)
        device = output_tensors[0].device
        for o, i in zip(output_tensors, input_tensors):
            checks.single(o)
            checks.single(i)
            if o.device != device or i.device != device:
                fail("tensors must be on the same device", PARAM)
        ins, outs = list(input_tensors), list(output_tensors)
        if len({t.dtype for t in ins + outs}) != 1:
            fail("Tensors are not equal in size or data type", PARAM)
        checks.dtype(ins[0])
        return self._submit("all_to_all", outs, lambda pg, ex: run.all_to_all(
            pg, ex, ins, outs, [t.numel() for t in ins], [t.numel() for t in outs]))

    @npu_only
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None) -> Work:
        out, inp = checks.single(output), checks.single(input)
        if (not output_split_sizes and not input_split_sizes and out.numel() != inp.numel()) or out.dtype != inp.dtype:
            fail("Tensors are not equal in size or data type", PARAM)
        checks.dtype(inp)
        send = checks.splits(inp, input_split_sizes, self._size)
        recv = checks.splits(out, output_split_sizes, self._size)
        row_in = inp.numel() // inp.shape[0] if inp.shape[0] else 0
        row_out = out.numel() // out.shape[0] if out.shape[0] else 0
        return self._submit("all_to_all_single", [out], lambda pg, ex: run.all_to_all(
            pg, ex, [inp], [out], [s * row_in for s in send], [s * row_out for s in recv]))

    all_to_all_single = alltoall_base

    # -- point to point and barrier --------------------------------------------------------------------------
    @npu_only
    def send(self, tensors, dstRank, tag=0) -> Work:
        t = checks.one_per_process(tensors)
        checks.dtype(t)
        ex = self._peer_executor("send", dstRank)
        return self._submit("send", [t], lambda pg, ex: run.send(pg, ex, t, dstRank), ex)

    @npu_only
    def recv(self, tensors, srcRank, tag=0) -> Work:
        t = checks.one_per_process(tensors)
        checks.dtype(t)
        ex = self._peer_executor("recv", srcRank)
        return self._submit("recv", [t], lambda pg, ex: run.recv(pg, ex, t, srcRank), ex)

    @npu_only
    def recv_anysource(self, tensors, tag=0) -> Work:
        fail("ProcessGroupHCCL does not support recv", NOT_SUPPORT)

    recvAnysource = recv_anysource

    def barrier(self, opts=None) -> Work:
        def wait_for_all(pg, ex):
            hccl.barrier(pg.comm, ex.stream)
            rt.synchronize_stream(ex.stream)
        return self._submit("barrier", [], wait_for_all)

    def __repr__(self) -> str:
        return f"ProcessGroupHCCL(rank={self._rank}, size={self._size}, card={self.device})"


def wait_all_groups(timeout: float = 1836.0) -> None:
    """torch.npu.synchronize: every group's outstanding work of this process has finished."""
    for pg in list(_groups):
        pg.drain(timeout)


def _create(dist_backend_opts, pg_options):
    """c10d's extended creator: the group's store, rank, size and timeout, and the user's ``pg_options``."""
    o = dist_backend_opts
    pg = ProcessGroupHCCL(o.store, o.group_rank, o.group_size, o.timeout, pg_options)
    pg.options._timeout = o.timeout
    pg.options.global_ranks_in_group = list(o.global_ranks_in_group)
    pg.options.group_id = o.group_id
    return pg


def register() -> None:
    """Register the backend (idempotent) for the ``npu`` device, as torch_npu does: ``init_process_group("hccl")``
    or ``"cpu:gloo,npu:hccl"`` (``routing.py``: what serves CPU tensors)."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["npu"])
