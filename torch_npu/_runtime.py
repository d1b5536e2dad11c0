"""The rank's cards as ``torch.npu`` reaches them: start the runtime when a call first needs a card, and the
runtime context of a device index, made current on the calling thread for the length of a call.

``torch.npu`` device indices are the process's visible cards (``ASCEND_RT_VISIBLE_DEVICES``), the same indices
``rt.set_device`` takes. Each index has one context per process (``rt.set_device``'s default context), shared by
every thread; streams and events made through ``torch.npu`` live in it.
"""

from __future__ import annotations

import contextlib
import os

import rt
from rt.host.runtime import RUNTIME

from ._error_code import ErrCode, pta_error
from .distributed import bootstrap


def _world_size() -> int:
    value = os.environ.get("WORLD_SIZE", "1")
    return int(value) if value.isdigit() else 1


def lazy_init() -> None:
    """Start the runtime if it is not running (``torch.npu.init``).

    Under ``launch`` and in a single process it starts at once. A rank of a multi-process job started without
    ``launch`` (``torchrun``, ``torch.multiprocessing``) reaches its cards through rank 0, which starts them at
    ``init_process_group``: before that there is no card to talk to, and the call says so.
    """
    if rt.is_initialized():
        return
    if not bootstrap.runtime_ready_without_store() and _world_size() > 1:
        raise RuntimeError(
            f"torch.npu: this process is one of {_world_size()} ranks started without launch; their cards are "
            f"started by rank 0 in torch.distributed.init_process_group('hccl'): call it before using NPU "
            f"streams, events or memory queries" + pta_error(ErrCode.UNAVAIL))
    bootstrap.ensure_runtime()


def context(index: int) -> rt.Context:
    """The context of card ``index`` (created on first use; the calling thread's current context is kept)."""
    lazy_init()
    ctx = RUNTIME.defaults.get(index)
    if ctx is None or ctx.destroyed:
        with RUNTIME.using(RUNTIME.current):
            rt.set_device(index)
        ctx = RUNTIME.defaults[index]
    return ctx


@contextlib.contextmanager
def on(index: int):
    """Card ``index`` current on this thread for the body (runtime calls that act on "the current device")."""
    ctx = context(index)
    with RUNTIME.using(ctx):
        yield ctx
