"""``npu`` as a real torch device type: PrivateUse1 named ``npu`` (``backend.py``), installed at ``import torch_npu``.

After :func:`install`, ``torch.device("npu:1")`` parses, ``t.npu()``, ``t.to("npu")``, ``model.npu()`` and
``torch.zeros(3, device="npu")`` give tensors whose ``device.type`` is ``npu`` (``t.is_npu`` is true), ``.cpu()``
brings them back, and every torch operator runs on them through torch's CPU kernels (``backend.py``); their
bytes are counted against the card's capacity (``storage.py``). What is simulated and what is not:
docs/torch.md.
"""

from __future__ import annotations

import functools
import inspect

import torch

from . import backend
from .storage import cpu_view

_installed = False

__all__ = ["cpu_view", "install"]


def _patch_ddp() -> None:
    """``DistributedDataParallel(cpu_module, device_ids=[i])``: ``device_ids`` dropped, as DDP asks of a CPU module
    (scripts written for npusim's earlier CPU tensors keep running)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    if getattr(DDP.__init__, "_npusim", False):
        return
    original = DDP.__init__
    sig = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        module = bound.arguments.get("module")
        ids = bound.arguments.get("device_ids")
        if ids is not None and module is not None and all(p.device.type == "cpu" for p in module.parameters()):
            bound.arguments["device_ids"] = None
            bound.arguments["output_device"] = None
        original(*bound.args, **bound.kwargs)
    __init__._npusim = True
    DDP.__init__ = __init__


def _patch_untyped_storage() -> None:
    """``torch.UntypedStorage(n, device="npu")`` (what ``storage.clone()``, ``copy.deepcopy`` of an npu tensor and
    ``storage.to("npu")`` call): made as an npu tensor's storage. torch would ask a C++ PrivateUse1 allocator,
    which a Python backend has not got (and crash)."""
    cls = torch.UntypedStorage
    if getattr(cls.__new__, "_npusim", False):
        return
    base_new = torch._C.StorageBase.__new__

    def __new__(klass, *args, device=None, **kwargs):
        if device is not None and not kwargs and len(args) <= 1 and all(type(a) is int for a in args) \
                and torch.device(device).type == "npu":
            return torch.empty(args[0] if args else 0, dtype=torch.uint8, device=device).untyped_storage()
        if device is not None:
            kwargs["device"] = device
        return base_new(klass, *args, **kwargs)
    __new__._npusim = True
    cls.__new__ = staticmethod(__new__)


def install() -> None:
    """Register the ``npu`` backend and ``torch.npu``; make npu storages; adapt DDP for CPU modules."""
    global _installed
    if _installed:
        return
    from . import npu
    backend.register(npu)
    _patch_untyped_storage()
    _patch_ddp()
    _installed = True
