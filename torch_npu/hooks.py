"""The ``npu`` accelerator hooks: ``hooks.cpp``, compiled once per torch build and registered before the backend.

torch asks an accelerator's hooks for its pinned-memory allocator (``Tensor.pin_memory()``, ``torch.empty(...,
pin_memory=True)``, ``DataLoader(pin_memory=True)``), whether a pointer is pinned (``Tensor.is_pinned()``) and for
new generators (``torch.Generator(device="npu")``), and to resize an npu storage (``UntypedStorage.resize_``, which
FSDP uses to free and re-allocate its flat parameters); torch's Python hooks class cannot answer those, so the ``npu``
hooks are C++ (built like ``device_guard.cpp``, with ``$CXX`` or ``g++``, into ``$NPUSIM_CACHE_DIR``). Without a
compiler torch's Python hooks are used, and pinned memory and npu generators fail as in a torch without them
(a warning says so). A resize asks :func:`storage.check_fits` and then tells :func:`storage.resized` (ctypes
callbacks), so the caching allocator's accounting follows the storage's new block.
"""

from __future__ import annotations

import ctypes
import warnings
from pathlib import Path

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from . import _cxx, storage

_FITS_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t)
_RESIZED_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t,
                                     ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t)

SOURCE = Path(__file__).with_name("hooks.cpp")
_lib = None


def _status(call, buffer: int, capacity: int, what: str) -> int:
    """``call()`` as hooks.cpp's callbacks answer: an exception cannot cross into C++, so it becomes a status (1 out
    of memory, 2 another error) with its message written into ``buffer``."""
    try:
        call()
    except torch.OutOfMemoryError as e:
        text, status = str(e), 1
    except BaseException as e:     # noqa: BLE001 - everything must become a status here
        text, status = f"{what}: {type(e).__name__}: {e}", 2
    else:
        return 0
    data = text.encode("utf-8", "replace")[:capacity]
    ctypes.memmove(buffer, data, len(data))
    return status


def _on_fits(device, nbytes, buffer, capacity) -> int:
    return _status(lambda: storage.check_fits(device, nbytes), buffer, capacity,
                   f"npu storage resize to {nbytes} bytes")


def _on_resized(device, old_ptr, new_ptr, nbytes, weak, buffer, capacity) -> int:
    ref = StorageWeakRef.from_weakref(weak)   # owns the weak reference hooks.cpp made
    return _status(lambda: storage.resized(device, old_ptr, new_ptr, nbytes, ref), buffer, capacity,
                   f"npu storage resize to {nbytes} bytes")


_callbacks = (_FITS_CALLBACK(_on_fits), _RESIZED_CALLBACK(_on_resized))   # kept alive: C++ holds their addresses


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
    lib.npusim_make_resizable.argtypes = [ctypes.c_size_t]
    lib.npusim_set_resize_callbacks.argtypes = [_FITS_CALLBACK, _RESIZED_CALLBACK]
    lib.npusim_set_resize_callbacks(*_callbacks)
    _lib = lib
    return True


def make_resizable(view: torch.Tensor) -> bool:
    """Let a CPU kernel resize ``view`` (a :func:`storage.cpu_view`) past its bytes, into new CPU memory, as it
    resizes a CPU ``out=`` tensor of the wrong size; False if the hooks are not built (then it cannot grow)."""
    if _lib is None:
        return False
    _lib.npusim_make_resizable(view.untyped_storage()._cdata)
    return True
