"""Build a small C++ file against the installed torch into ``$NPUSIM_CACHE_DIR`` (default ``~/.cache/npusim``), once
per source and torch build, and load it with ctypes (no Python extension module: the file exports C functions)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import torch


def cache_dir() -> Path:
    root = os.environ.get("NPUSIM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "npusim")
    return Path(root)


def build(source: Path, libs: tuple[str, ...] = ("c10",)) -> Path:
    """The shared library of ``source`` for this torch (compiled if not cached); raises OSError if it cannot be."""
    torch_dir = Path(torch.__file__).parent
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    key = hashlib.sha256(source.read_bytes() + f"{torch.__version__}|{torch_dir}|{abi}|{libs}".encode()).hexdigest()
    out = cache_dir() / f"npu_{source.stem}-{key[:16]}.so"
    if out.exists():
        return out
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise OSError("no C++ compiler (set CXX or install g++)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    cmd = [cxx, "-O2", "-shared", "-fPIC", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
           "-I", str(torch_dir / "include"), str(source), "-L", str(torch_dir / "lib"),
           *(f"-l{lib}" for lib in libs), f"-Wl,-rpath,{torch_dir / 'lib'}", "-o", str(tmp)]
    try:
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        raise OSError(f"{cxx} did not finish in 300 s") from e
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise OSError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")
    os.replace(tmp, out)                 # atomic: ranks that build at the same time all end with one file
    return out


def load(source: Path, libs: tuple[str, ...] = ("c10",)) -> ctypes.CDLL:
    return ctypes.CDLL(str(build(source, libs)))
