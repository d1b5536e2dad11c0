"""Tensor-level collectives as methods of ``Communicator``: ``comm.all_reduce(t)`` and friends over
``rt.Tensor``s (a mixin of the class, written on the pointer-level calls of ``hccl/api.py``)."""

from __future__ import annotations

import rt
from rt.host.runtime import RUNTIME

from . import api
from .errors import HcclError
from .types import HcclResult, hccl_dtype


class TensorCollectives:
    """The collectives on ``rt.Tensor``s, in place where HCCL's are; new tensors live on the comm's card."""

    def _on_card(self, fn):
        with RUNTIME.using(self.ctx):
            return fn()

    def all_reduce(self, t: rt.Tensor, op="sum", stream=None) -> rt.Tensor:
        """In place: t = op over ranks of t."""
        api.all_reduce(t.ptr, t.ptr, t.size, hccl_dtype(t.dtype), op, self, stream)
        return t

    def broadcast(self, t: rt.Tensor, root: int = 0, stream=None) -> rt.Tensor:
        api.broadcast(t.ptr, t.size, hccl_dtype(t.dtype), root, self, stream)
        return t

    def reduce(self, t: rt.Tensor, root: int = 0, op="sum", stream=None) -> rt.Tensor:
        """In place on the root; other ranks' t is left as it was."""
        api.reduce(t.ptr, t.ptr, t.size, hccl_dtype(t.dtype), op, root, self, stream)
        return t

    def all_gather(self, t: rt.Tensor, stream=None) -> rt.Tensor:
        """A new tensor of shape (ranks, *t.shape) holding every rank's t."""
        out = self._on_card(lambda: rt.empty((self.size, *t.shape), t.dtype))
        api.all_gather(t.ptr, out.ptr, t.size, hccl_dtype(t.dtype), self, stream)
        return out

    def reduce_scatter(self, t: rt.Tensor, op="sum", stream=None) -> rt.Tensor:
        """t's first dimension is split over the ranks; returns this rank's reduced block."""
        if not t.shape or t.shape[0] % self.size:
            raise HcclError(HcclResult.HCCL_E_PARA, f"reduce_scatter: first dimension of {t.shape} is not "
                                                    f"divisible by {self.size} ranks")
        block = (t.shape[0] // self.size, *t.shape[1:])
        out = self._on_card(lambda: rt.empty(block, t.dtype))
        api.reduce_scatter(t.ptr, out.ptr, out.size, hccl_dtype(t.dtype), op, self, stream)
        return out

    def all_to_all(self, t: rt.Tensor, stream=None) -> rt.Tensor:
        """Block j of t (split on the first dimension) goes to rank j; returns the received blocks."""
        if not t.shape or t.shape[0] % self.size:
            raise HcclError(HcclResult.HCCL_E_PARA, f"all_to_all: first dimension of {t.shape} is not "
                                                    f"divisible by {self.size} ranks")
        out = self._on_card(lambda: rt.empty(t.shape, t.dtype))
        n = t.size // self.size
        code = hccl_dtype(t.dtype)
        api.all_to_all(t.ptr, n, code, out.ptr, n, code, self, stream)
        return out

    def barrier(self, stream=None) -> None:
        api.barrier(self, stream)

    def send(self, t: rt.Tensor, dst: int, stream=None) -> None:
        api.send(t.ptr, t.size, hccl_dtype(t.dtype), dst, self, stream)

    def recv(self, t: rt.Tensor, src: int, stream=None) -> rt.Tensor:
        api.recv(t.ptr, t.size, hccl_dtype(t.dtype), src, self, stream)
        return t

    def synchronize(self, stream=None) -> None:
        """Wait for this rank's queued collectives (the default stream, or ``stream``)."""
        self._on_card(lambda: rt.synchronize_stream(stream))
