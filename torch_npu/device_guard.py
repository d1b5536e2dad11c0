"""The ``npu`` device guard: ``device_guard.cpp``, compiled once per torch build and loaded before the backend.

torch's Python device guard for PrivateUse1 (``torch._C._acc.DeviceGuard``) says there is one device, index 0.
The autograd engine sizes its per-device ready queues from that count, so ``backward()`` on an ``npu:k`` tensor
for k > 0 fails an internal assert. ``device_guard.cpp`` is the same guard with the index and the device count
that npu tensors need (no streams or events of its own: the kernels run on the host). It is built with the C++
compiler (``$CXX``, else ``g++``) against the installed torch's headers into ``$NPUSIM_CACHE_DIR`` (default
``~/.cache/npusim``) the first time (~2 s), and reused after. Without a compiler, torch's Python guard is used
and autograd works on ``npu:0`` only (a warning says so).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("device_guard.cpp")
_lib = None


def _cache_dir() -> Path:
    root = os.environ.get("NPUSIM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "npusim")
    return Path(root)


def build() -> Path:
    """The guard's shared library for this torch (compiled if not cached); raises OSError if it cannot be."""
    torch_dir = Path(torch.__file__).parent
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    key = hashlib.sha256(SOURCE.read_bytes() + f"{torch.__version__}|{torch_dir}|{abi}".encode()).hexdigest()[:16]
    out = _cache_dir() / f"npu_device_guard-{key}.so"
    if out.exists():
        return out
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise OSError("no C++ compiler (set CXX or install g++)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    cmd = [cxx, "-O2", "-shared", "-fPIC", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
           "-I", str(torch_dir / "include"), str(SOURCE), "-L", str(torch_dir / "lib"), "-lc10",
           f"-Wl,-rpath,{torch_dir / 'lib'}", "-o", str(tmp)]
    try:
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        raise OSError(f"{cxx} did not finish in 300 s") from e
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise OSError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")
    os.replace(tmp, out)                 # atomic: ranks that build at the same time all end with one file
    return out


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
        lib = ctypes.CDLL(str(build()))
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
