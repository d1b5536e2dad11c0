"""What a rank holds of a communicator, as the pointer-level API (``hccl/api.py``) uses it: identity, card,
call numbering and the host path, and the check every call makes. ``hccl.Communicator`` (``hccl/comm.py``)
is this plus the ``rt.Tensor`` methods."""

from __future__ import annotations

import itertools

from rt import args

from . import hostpath
from .errors import HcclError
from .types import HcclResult


class CommHandle:
    """One rank's handle on a communicator, bound to one card (the device current at init)."""

    def __init__(self, ctx, comm_id: str, rank: int, size: int, members: list, options: dict):
        self.ctx = ctx
        self.id = comm_id
        self.rank = rank
        self.size = size
        self.members = members
        self.options = options
        self.seqs = itertools.count(1)    # next(): the next call's number (atomic: calls from several threads)
        self.destroyed = False
        self._host = False             # HostPath once built (None: this communicator has none)
        self.lead = None               # the rounds across nodes this rank's process leads (nodestaged.HostLead)
        self.calls: dict = {}          # call signature -> Call: its arguments checked once (hccl/api.py)
        hostpath.joined(comm_id)

    def host_path(self):
        """Where this rank runs small collectives itself when its stream is idle (``hccl/hostpath.py``)."""
        if self._host is False:
            self._host = hostpath.HostPath.build(self)
        return self._host

    @property
    def world_size(self) -> int:
        return self.size

    @property
    def device(self) -> int:
        return self.ctx.device

    def __repr__(self):
        return f"Communicator({self.id!r}, rank {self.rank}/{self.size} on {self.ctx.name})"


class Call:
    """One call signature of one communicator, checked once (``hccl/api.py``): the stream it goes to, the
    parameters and buffers every call with these arguments sends, and what the host path prepared for it."""

    __slots__ = ("buffers", "host", "op", "params", "stream", "wire")

    def __init__(self, op: str, stream, params: dict, buffers: dict):
        self.op = op
        self.stream = stream
        self.params = params
        self.buffers = buffers
        self.wire = {k: v for k, v in buffers.items() if v is not None}     # what goes to the card
        self.host = False               # hostpath.Prepared, None (not on the host path), False: not asked yet


def _check_comm(comm, call) -> CommHandle:
    if not isinstance(comm, CommHandle):
        raise HcclError(HcclResult.HCCL_E_PARA, f"{call}: {args.shown(comm)} is not a communicator")
    if comm.destroyed or comm.ctx.destroyed:
        raise HcclError(HcclResult.HCCL_E_PARA, f"{call}: communicator '{comm.id}' was destroyed")
    return comm
