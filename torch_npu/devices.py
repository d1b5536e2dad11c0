"""``npu`` as a device name: what torch_npu scripts write, mapped honestly onto CPU tensors.

A real ``npu:N`` tensor lives in the card's memory behind a PrivateUse1 backend with its own allocator and
kernels (C++). npusim does not simulate that: a rank's tensors are CPU tensors, and what is simulated is the
card the rank is bound to, where its ``"hccl"`` collectives run. So that scripts run unchanged:

- ``torch.device("npu:1")`` parses (PrivateUse1 is named ``npu``) and ``torch.npu`` is the module in ``npu.py``;
- ``t.npu()``, ``t.to("npu")``, ``t.to(torch.device("npu", i))``, ``model.to(device)``, ``model.npu()`` and
  ``device="npu..."`` in factory functions (``torch.ones(3, device="npu")``) give CPU tensors — a function mode
  rewrites npu devices to ``cpu`` on the thread that imported torch_npu (other threads: call ``.cpu()``);
- ``DistributedDataParallel(model, device_ids=[local_rank])`` drops ``device_ids``/``output_device`` when the
  module's parameters are on the CPU, which is what DDP asks of a CPU module.

``t.device`` says ``cpu``, ``t.is_npu`` does not exist: code that branches on them sees CPU tensors.
"""

from __future__ import annotations

import functools
import inspect
import warnings

import torch
from torch.overrides import TorchFunctionMode

_installed = False


def _to_cpu(x):
    if isinstance(x, torch.device) and x.type == "npu":
        return torch.device("cpu")
    if isinstance(x, str) and (x == "npu" or x.startswith("npu:")):
        return "cpu"
    return x


class NpuAsCpu(TorchFunctionMode):
    """Rewrites npu devices in any torch call's arguments to ``cpu``."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.device:                     # the name itself stays: torch.device("npu:1") is npu:1
            return func(*args, **(kwargs or {}))
        if kwargs:
            dev = kwargs.get("device")
            if dev is not None:
                kwargs = dict(kwargs, device=_to_cpu(dev))
        else:
            kwargs = {}
        if args:
            args = tuple(_to_cpu(a) if isinstance(a, (str, torch.device)) else a for a in args)
        return func(*args, **kwargs)


def _tensor_npu(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
    """``Tensor.npu()``: the tensor itself (it is a CPU tensor tied to the rank's card, docs/torch.md)."""
    return self


def _module_npu(self, device=None):
    """``Module.npu()``: the module itself, parameters left on the CPU."""
    return self


def _patch_ddp() -> None:
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


def _register_hooks() -> None:
    """What torch asks of a named PrivateUse1 (``torch._C._get_accelerator()``, used by ``dist.barrier``, needs
    its hooks); the tensors themselves never reach PrivateUse1."""
    acc = torch._C._acc

    class Hooks(acc.PrivateUse1Hooks):
        def is_available(self) -> bool:
            return True

        def has_primary_context(self, dev_id) -> bool:
            return True

        def is_built(self) -> bool:
            return True

    class Guard(acc.DeviceGuard):
        def type_(self):
            return torch._C._autograd.DeviceType.PrivateUse1

    acc.register_python_privateuseone_hook(Hooks())
    acc.register_python_privateuseone_device_guard(Guard())


def install() -> None:
    """Name PrivateUse1 ``npu``, register ``torch.npu``, add ``.npu()``, push the device mode, adapt DDP."""
    global _installed
    if _installed:
        return
    from . import npu
    try:
        torch.utils.rename_privateuse1_backend("npu")
    except RuntimeError as e:                        # already renamed: fine if to "npu"
        if torch._C._get_privateuse1_backend_name() != "npu":
            warnings.warn(f"torch_npu (npusim): PrivateUse1 is already named "
                          f"{torch._C._get_privateuse1_backend_name()!r}; 'npu' devices will not parse ({e})")
    if not hasattr(torch, "npu"):
        torch._register_device_module("npu", npu)
        _register_hooks()
    torch.Tensor.npu = _tensor_npu
    torch.nn.Module.npu = _module_npu
    NpuAsCpu().__enter__()                           # for the rest of this thread's life
    _patch_ddp()
    _installed = True
