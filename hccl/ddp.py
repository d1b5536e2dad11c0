"""Gradient synchronisation for data-parallel training: bucketed, overlapped, averaged (DDP-style).

    dp = hccl.DataParallel(comm, [w1, b1, w2, b2])         # parameters in forward order
    for x, y in batches:
        ... forward ...
        rt.ops.gemm(a1, dy, transA=1, out=[dp.grad(w2)])    # backward writes into dp's gradient views
        dp.mark_ready(w2)                                   # its bucket starts reducing when complete
        ...
        dp.finish()                                         # compute stream now waits for every bucket
        rt.ops.sgd_momentum(w2, dp.grad(w2), v2, lr=0.1)

How it works (PyTorch DDP's reducer; Horovod calls the same idea tensor fusion):

- Parameters are assigned to *buckets* in reverse order (backward produces the last layer's
  gradients first), one bucket list per dtype. A bucket closes once it holds ``bucket_bytes``
  (default 25 MiB); the first bucket of each dtype closes at ``first_bucket_bytes`` (1 MiB) so the
  first all-reduce starts early in the backward pass.
- Each bucket is one flat device buffer; every gradient is a ``Tensor.view`` into it, so the
  backward kernels write straight into the buffer the collective reduces: no flatten copy.
- When the last gradient of a bucket is marked ready, an event is recorded on the compute stream,
  the communication stream waits on it (``rt.stream_wait_event``), and the bucket is all-reduced
  and scaled by 1/N (a ``Mul`` kernel) on the communication stream — while the compute stream goes
  on with the rest of the backward pass.
- Buckets are launched strictly in bucket order, so every rank issues the same sequence of
  collectives even if gradients become ready in a slightly different order on different ranks.
- ``finish()`` launches whatever is left, records an event on the communication stream after the
  last bucket and makes the compute stream wait for it: the optimizer step that follows on the
  compute stream sees averaged gradients, and the host never blocks.

``all_reduce_gradients`` is the unbucketed baseline (one collective per tensor), and
``broadcast_parameters`` copies rank 0's initial parameters to every rank.
"""

from __future__ import annotations


import numpy as np

import rt
from rt import args
from rt.host.runtime import RUNTIME

from . import api
from .comm import Communicator, _check_comm
from .errors import HcclError, hccl_para
from .types import HcclResult, hccl_dtype

MIB = 1 << 20
DEFAULT_BUCKET_BYTES = 25 * MIB
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB


_on = RUNTIME.using


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype == rt.BFLOAT16


def _reducible(dtype: np.dtype, what: str) -> None:
    try:
        hccl_dtype(dtype)
    except (KeyError, ValueError, rt.AclError):
        raise HcclError(HcclResult.HCCL_E_PARA, f"{what} has dtype {dtype}, which HCCL cannot reduce (expected "
                                                f"int8..uint64, float16, bfloat16, float32 or float64)") from None


_scales: dict[tuple, rt.Tensor] = {}


def _scale(comm: Communicator, dtype: np.dtype) -> rt.Tensor:
    """The scalar 1/N of ``dtype`` on the comm's card, made once per (communicator, rank, dtype)."""
    key = (comm.id, comm.rank, id(comm.ctx), dtype)
    t = _scales.get(key)
    if t is None or t.ctx.destroyed:
        with _on(comm.ctx):
            # uploaded as shape (1,) and viewed as a scalar, so it broadcasts to any gradient shape
            t = _scales[key] = rt.Tensor.from_numpy(np.full(1, 1.0 / comm.size, dtype=dtype)).view(())
    return t


def _spec(item, i: int) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of a parameter given as an rt.Tensor, a numpy array or a (shape, dtype) pair."""
    if isinstance(item, (rt.Tensor, np.ndarray)):
        return tuple(item.shape), np.dtype(item.dtype)
    try:
        shape, dtype = item
        return tuple(int(d) for d in shape), rt.np_dtype(dtype)
    except (TypeError, ValueError):
        raise HcclError(HcclResult.HCCL_E_PARA, f"DataParallel: parameter {i} is {item!r}, expected an rt.Tensor, "
                                                f"a numpy array or a (shape, dtype) pair") from None


def assign_buckets(specs, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                   first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES) -> list[list[int]]:
    """Parameter indices per bucket, in launch order (pure; DDP's compute_bucket_assignment_by_size).

    Walks the parameters in reverse; per dtype, a bucket closes when it reaches its limit (the first
    bucket of a dtype uses ``first_bucket_bytes``). A parameter larger than the limit gets a bucket
    of its own. Buckets are ordered by the reverse position of their first parameter.
    """
    open_buckets: dict[np.dtype, list[int]] = {}
    open_bytes: dict[np.dtype, int] = {}
    closed_count: dict[np.dtype, int] = {}
    done: list[list[int]] = []
    for i in reversed(range(len(specs))):
        shape, dtype = specs[i]
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        open_buckets.setdefault(dtype, []).append(i)
        open_bytes[dtype] = open_bytes.get(dtype, 0) + nbytes
        limit = first_bucket_bytes if closed_count.get(dtype, 0) == 0 else bucket_bytes
        if open_bytes[dtype] >= limit:
            done.append(open_buckets.pop(dtype))
            open_bytes[dtype] = 0
            closed_count[dtype] = closed_count.get(dtype, 0) + 1
    done.extend(open_buckets.values())
    order = {i: pos for pos, i in enumerate(reversed(range(len(specs))))}
    return sorted(done, key=lambda bucket: order[bucket[0]])


class _Bucket:
    """One flat gradient buffer of one dtype and the bookkeeping of one backward pass."""

    def __init__(self, index: int, members: list[int], specs, dtype: np.dtype):
        self.index = index
        self.members = members
        self.dtype = dtype
        self.offsets: dict[int, int] = {}
        nbytes = 0
        for i in members:
            self.offsets[i] = nbytes
            nbytes += int(np.prod(specs[i][0], dtype=np.int64)) * dtype.itemsize
        self.nbytes = nbytes
        self.buffer: rt.Tensor | None = None
        self.ready: set[int] = set()
        self.launched = False
        self.ready_event = None     # recorded on the compute stream when the bucket is complete
        self.start_event = None     # comm stream: before / after the all-reduce (timing)
        self.end_event = None


class DataParallel:
    """Bucketed, overlapped gradient all-reduce for one rank (see the module docstring)."""

    def __init__(self, comm: Communicator, params, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES, average: bool = True,
                 compute_stream=None, comm_stream=None, timing: bool = False):
        _check_comm(comm, "DataParallel")
        for name, value in (("bucket_bytes", bucket_bytes), ("first_bucket_bytes", first_bucket_bytes)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise HcclError(HcclResult.HCCL_E_PARA, f"DataParallel: {name}={value!r}, expected an int >= 1")
        params = list(params)
        if not params:
            raise HcclError(HcclResult.HCCL_E_PARA, "DataParallel: no parameters given")
        self.comm = comm
        self.average = average
        self.timing = timing
        self.specs = [_spec(p, i) for i, p in enumerate(params)]
        # Parameters are found again by identity (rt.Tensor / ndarray) or by index.
        self._index = {id(p): i for i, p in enumerate(params)}
        for i, (_, dtype) in enumerate(self.specs):
            _reducible(dtype, f"DataParallel: parameter {i}")
            if average and not _is_float(dtype):
                raise HcclError(HcclResult.HCCL_E_PARA,
                                f"DataParallel: parameter {i} has integer dtype {dtype}, which cannot be averaged; "
                                f"pass average=False to sum gradients instead")
        self.buckets = [_Bucket(b, members, self.specs, self.specs[members[0]][1])
                        for b, members in enumerate(assign_buckets(self.specs, int(bucket_bytes),
                                                                   int(first_bucket_bytes)))]
        self._bucket_of = {i: bucket for bucket in self.buckets for i in bucket.members}
        self._grads: list[rt.Tensor | None] = [None] * len(params)
        self._scales: dict[np.dtype, rt.Tensor] = {}
        self._next = 0                      # next bucket to launch (strict bucket order)
        with _on(comm.ctx):
            self.compute_stream = compute_stream
            self.comm_stream = comm_stream if comm_stream is not None else rt.create_stream()
            self._own_comm_stream = comm_stream is None
            self.done_event = rt.create_event()
            for bucket in self.buckets:
                bucket.buffer = rt.empty((bucket.nbytes // bucket.dtype.itemsize,), bucket.dtype)
                # zeroed so that a gradient never written (an unused parameter) reduces to 0
                rt.memset(bucket.buffer.ptr, bucket.buffer.nbytes, 0, bucket.buffer.nbytes)
                bucket.ready_event = rt.create_event()
                if timing:
                    bucket.start_event, bucket.end_event = rt.create_event(), rt.create_event()
                for i in bucket.members:
                    shape, dtype = self.specs[i]
                    self._grads[i] = bucket.buffer.view(shape, dtype, offset=bucket.offsets[i])
            if average:
                for dtype in {b.dtype for b in self.buckets}:
                    self._scales[dtype] = _scale(comm, dtype)

    # -- gradients -------------------------------------------------------------------------------

    def _param_index(self, param) -> int:
        if isinstance(param, (int, np.integer)) and not isinstance(param, bool):
            if not 0 <= param < len(self.specs):
                raise HcclError(HcclResult.HCCL_E_PARA, f"DataParallel: parameter index {param} is outside "
                                                        f"[0, {len(self.specs)})")
            return int(param)
        i = self._index.get(id(param))
        if i is None:
            raise HcclError(HcclResult.HCCL_E_PARA, f"DataParallel: {param!r} is not one of the registered parameters")
        return i

    def grad(self, param) -> rt.Tensor:
        """The gradient tensor of ``param`` (the param itself or its index): a view into its bucket."""
        return self._grads[self._param_index(param)]

    @property
    def grads(self) -> list[rt.Tensor]:
        """Gradient views in parameter order."""
        return list(self._grads)

    # -- one backward pass -----------------------------------------------------------------------

    def mark_ready(self, param, stream=None) -> None:
        """Say that ``param``'s gradient has been enqueued on the compute stream (``stream`` or the one
        given at construction); launches every bucket that is now complete, in bucket order."""
        i = self._param_index(param)
        bucket = self._bucket_of[i]
        if bucket.launched or i in bucket.ready:
            raise HcclError(HcclResult.HCCL_E_PARA, f"DataParallel.mark_ready: the gradient of parameter {i} was "
                                                    f"already marked ready in this step (call finish() once per step)")
        bucket.ready.add(i)
        self._launch_ready(self.compute_stream if stream is None else stream)

    def _launch_ready(self, stream) -> None:
        while self._next < len(self.buckets) and \
                len(self.buckets[self._next].ready) == len(self.buckets[self._next].members):
            self._launch(self.buckets[self._next], stream)
            self._next += 1

    def _launch(self, bucket: _Bucket, compute_stream) -> None:
        with _on(self.comm.ctx):
            rt.record_event(bucket.ready_event, compute_stream)
            rt.stream_wait_event(self.comm_stream, bucket.ready_event)
            if self.timing:
                rt.record_event(bucket.start_event, self.comm_stream)
            buf = bucket.buffer
            api.all_reduce(buf.ptr, buf.ptr, buf.size, hccl_dtype(buf.dtype), "sum", self.comm, self.comm_stream)
            if self.average:
                rt.ops.mul(buf, self._scales[bucket.dtype], out=[buf], stream=self.comm_stream)
            if self.timing:
                rt.record_event(bucket.end_event, self.comm_stream)
        bucket.launched = True

    def finish(self, stream=None) -> None:
        """End the step: launch the remaining buckets, then make the compute stream wait for the last one.

        Gradients never marked ready are reduced as they are (DDP would raise here; the bucket
        buffers start zeroed, so an unused parameter contributes 0).
        """
        stream = self.compute_stream if stream is None else stream
        while self._next < len(self.buckets):
            self._launch(self.buckets[self._next], stream)
            self._next += 1
        with _on(self.comm.ctx):
            rt.record_event(self.done_event, self.comm_stream)
            rt.stream_wait_event(stream, self.done_event)
        for bucket in self.buckets:
            bucket.ready.clear()
            bucket.launched = False
        self._next = 0

    def comm_time_ms(self) -> float:
        """Card-measured milliseconds the last step's buckets spent in all-reduce + scale (needs
        ``timing=True``; waits for the communication stream)."""
        if not self.timing:
            raise HcclError(HcclResult.HCCL_E_PARA, "DataParallel.comm_time_ms: construct with timing=True")
        with _on(self.comm.ctx):
            rt.synchronize_stream(self.comm_stream)
            return sum(rt.event_elapsed_time(b.start_event, b.end_event) for b in self.buckets)

    def close(self) -> None:
        """Free the bucket buffers, events and the communication stream this object created."""
        with _on(self.comm.ctx):
            rt.synchronize_stream(self.comm_stream)
            for bucket in self.buckets:
                bucket.buffer.free()
                for ev in (bucket.ready_event, bucket.start_event, bucket.end_event):
                    if ev is not None:
                        rt.destroy_event(ev)
            rt.destroy_event(self.done_event)
            if self._own_comm_stream:
                rt.destroy_stream(self.comm_stream)
        self.buckets = []

    def __repr__(self) -> str:
        sizes = ", ".join(f"{b.nbytes}B×{len(b.members)} {b.dtype}" for b in self.buckets)
        return f"DataParallel(rank {self.comm.rank}/{self.comm.size}, buckets [{sizes}])"


def all_reduce_gradients(grads, comm: Communicator, *, average: bool = True, stream=None) -> None:
    """Unbucketed baseline: all-reduce each gradient tensor in place (one collective per tensor) on
    ``stream`` and scale it by 1/N; asynchronous like any collective."""
    _check_comm(comm, "all_reduce_gradients")
    grads = args.sequence(grads, "all_reduce_gradients", "grads", error=hccl_para)
    average = args.flag(average, "all_reduce_gradients", "average", error=hccl_para)
    with _on(comm.ctx):
        for i, g in enumerate(grads):
            if not isinstance(g, rt.Tensor):
                raise HcclError(HcclResult.HCCL_E_PARA, f"all_reduce_gradients: gradient {i} is {type(g).__name__}, "
                                                        f"expected rt.Tensor")
            _reducible(g.dtype, f"all_reduce_gradients: gradient {i}")
            if average and not _is_float(g.dtype):
                raise HcclError(HcclResult.HCCL_E_PARA, f"all_reduce_gradients: gradient {i} has integer dtype "
                                                        f"{g.dtype}, which cannot be averaged (average=False)")
            api.all_reduce(g.ptr, g.ptr, g.size, hccl_dtype(g.dtype), "sum", comm, stream)
            if average:
                rt.ops.mul(g, _scale(comm, g.dtype), out=[g], stream=stream)


def broadcast_parameters(params, comm: Communicator, root: int = 0, stream=None) -> None:
    """Copy ``root``'s parameter tensors to every rank, in place (asynchronous on ``stream``)."""
    _check_comm(comm, "broadcast_parameters")
    for i, p in enumerate(args.sequence(params, "broadcast_parameters", "params", error=hccl_para)):
        if not isinstance(p, rt.Tensor):
            raise HcclError(HcclResult.HCCL_E_PARA, f"broadcast_parameters: parameter {i} is {type(p).__name__}, "
                                                    f"expected rt.Tensor")
        api.broadcast(p.ptr, p.size, hccl_dtype(p.dtype), root, comm, stream)
