"""The ``npu`` accelerator hooks: ``hooks.cpp``, compiled once per torch build and registered before the backend.

torch asks an accelerator's hooks for its pinned-memory allocator (``Tensor.pin_memory()``, ``torch.empty(...,
pin_memory=True)``, ``DataLoader(pin_memory=True)``), whether a pointer is pinned (``Tensor.is_pinned()``) and for
new generators (``torch.Generator(device="npu")``); torch's Python hooks class cannot answer those, so the ``npu``
hooks are C++ (built like ``device_guard.cpp``, with ``$CXX`` or ``g++``, into ``$NPUSIM_CACHE_DIR``). Without a
compiler torch's Python hooks are used, and pinned memory and npu generators fail as in a torch without them
(a warning says so).
"""

from __future__ import annotations

import warnings
from pathlib import Path

from . import _cxx

SOURCE = Path(__file__).with_name("hooks.cpp")
_lib = None


def install() -> bool:
    """Register the C++ hooks for PrivateUse1 (torch keeps the first hooks registered); False, with a warning, if
    they cannot be built or another set is registered already."""
    global _lib
    if _lib is not None:
        return True
    try:
        lib = _cxx.load(SOURCE, ("c10", "torch_cpu"))
    except OSError as e:
        warnings.warn(f"torch_npu (npusim): could not build the npu hooks ({e}); pinned memory and "
                      f"torch.Generator(device='npu') are not available", RuntimeWarning, stacklevel=3)
        return False
    if not lib.npusim_register_npu_hooks():
        warnings.warn("torch_npu (npusim): PrivateUse1 already has hooks; pinned memory and npu generators may "
                      "not work", RuntimeWarning, stacklevel=3)
        return False
    _lib = lib
    return True
