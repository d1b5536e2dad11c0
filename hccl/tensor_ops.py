"""Tensor-level helpers on ``Communicator``: ``comm.all_reduce(t)`` and friends over ``rt.Tensor``s."""

from __future__ import annotations

import rt
from rt.context import RUNTIME

from . import api
from .comm import Communicator
from .types import hccl_dtype


def _on_card(comm, fn):
    with RUNTIME.using(comm.ctx):
        return fn()


def all_reduce(self: Communicator, t: rt.Tensor, op="sum", stream=None) -> rt.Tensor:
    """In place: t = op over ranks of t."""
    api.all_reduce(t.ptr, t.ptr, t.size, hccl_dtype(t.dtype), op, self, stream)
    return t


def broadcast(self: Communicator, t: rt.Tensor, root: int = 0, stream=None) -> rt.Tensor:
    api.broadcast(t.ptr, t.size, hccl_dtype(t.dtype), root, self, stream)
    return t


def reduce(self: Communicator, t: rt.Tensor, root: int = 0, op="sum", stream=None) -> rt.Tensor:
    """In place on the root; other ranks' t is left as it was."""
    api.reduce(t.ptr, t.ptr, t.size, hccl_dtype(t.dtype), op, root, self, stream)
    return t


def all_gather(self: Communicator, t: rt.Tensor, stream=None) -> rt.Tensor:
    """A new tensor of shape (ranks, *t.shape) holding every rank's t."""
    out = _on_card(self, lambda: rt.empty((self.size, *t.shape), t.dtype))
    api.all_gather(t.ptr, out.ptr, t.size, hccl_dtype(t.dtype), self, stream)
    return out


def reduce_scatter(self: Communicator, t: rt.Tensor, op="sum", stream=None) -> rt.Tensor:
    """t's first dimension is split over the ranks; returns this rank's reduced block."""
    if not t.shape or t.shape[0] % self.size:
        raise rt.HcclError(1, f"reduce_scatter: first dimension of {t.shape} is not divisible by {self.size} ranks")
    block = (t.shape[0] // self.size, *t.shape[1:])
    out = _on_card(self, lambda: rt.empty(block, t.dtype))
    api.reduce_scatter(t.ptr, out.ptr, out.size, hccl_dtype(t.dtype), op, self, stream)
    return out


def all_to_all(self: Communicator, t: rt.Tensor, stream=None) -> rt.Tensor:
    """Block j of t (split on the first dimension) goes to rank j; returns the received blocks."""
    if not t.shape or t.shape[0] % self.size:
        raise rt.HcclError(1, f"all_to_all: first dimension of {t.shape} is not divisible by {self.size} ranks")
    out = _on_card(self, lambda: rt.empty(t.shape, t.dtype))
    n = t.size // self.size
    code = hccl_dtype(t.dtype)
    api.all_to_all(t.ptr, n, code, out.ptr, n, code, self, stream)
    return out


def barrier(self: Communicator, stream=None) -> None:
    api.barrier(self, stream)


def send(self: Communicator, t: rt.Tensor, dst: int, stream=None) -> None:
    api.send(t.ptr, t.size, hccl_dtype(t.dtype), dst, self, stream)


def recv(self: Communicator, t: rt.Tensor, src: int, stream=None) -> rt.Tensor:
    api.recv(t.ptr, t.size, hccl_dtype(t.dtype), src, self, stream)
    return t


def synchronize(self: Communicator, stream=None) -> None:
    """Wait for this rank's queued collectives (the default stream, or ``stream``)."""
    _on_card(self, lambda: rt.synchronize_stream(stream))


for _fn in (all_reduce, broadcast, reduce, all_gather, reduce_scatter, all_to_all, barrier, send, recv, synchronize):
    setattr(Communicator, _fn.__name__, _fn)
