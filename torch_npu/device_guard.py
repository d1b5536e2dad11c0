"""The ``npu`` device guard: ``device_guard.cpp``, compiled once per torch build and loaded before the backend.

torch's Python device guard for PrivateUse1 (``torch._C._acc.DeviceGuard``) says there is one device, index 0.
The autograd engine sizes its per-device ready queues from that count, so ``backward()`` on an ``npu:k`` tensor
for k > 0 fails an internal assert. ``device_guard.cpp`` is the same guard with the index and the device count
that npu tensors need (no streams or events of its own: the kernels run on the host). It is built with the C++
compiler (``$CXX``, else ``g++``) against the installed torch's headers into ``$NPUSIM_CACHE_DIR`` (default
``~/.cache/npusim``) the first time (~2 s), and reused after (``_cxx.py``, shared with ``hooks.cpp``). Without a compiler, torch's Python guard is used
and autograd works on ``npu:0`` only (a warning says so).
"""

from __future__ import annotations

import ctypes
import warnings
from pathlib import Path

from . import _cxx

SOURCE = Path(__file__).with_name("device_guard.cpp")
_lib = None


def _device_count() -> int:
    """Device indices the guard accepts: the cards of one node in the config (each gets an autograd thread)."""
    from rt.config import load_config
    return max(1, int(load_config(None).cards_per_node))


def install() -> bool:
    """Register the guard for PrivateUse1 (before torch's Python one); False, with a warning, if it cannot be."""
    global _lib
    if _lib is not None:
        return True
    try:
        lib = _cxx.load(SOURCE)
    except OSError as e:
        warnings.warn(f"torch_npu (npusim): could not build the npu device guard ({e}); autograd works on npu:0 "
                      f"only", RuntimeWarning, stacklevel=3)
        return False
    lib.npusim_register_npu_guard.argtypes = [ctypes.c_int]
    if not lib.npusim_register_npu_guard(_device_count()):
        warnings.warn("torch_npu (npusim): PrivateUse1 already has a device guard; autograd may work on npu:0 only",
                      RuntimeWarning, stacklevel=3)
        return False
    _lib = lib
    return True
