"""How the processes npusim starts copy large buffers: with non-temporal stores from ``NPUSIM_NT_COPY_BYTES`` up.

A collective's large copies write memory nobody reads again soon (a peer's receive buffer). glibc's ``memcpy``
writes through the cache, so each line written is first read from memory (a read for ownership), unless the copy
is larger than its non-temporal threshold — by default three quarters of the shared cache per thread, 192 MiB on
this machine kind, so never. A 16 MiB broadcast on 8 ranks and 2 cores writes 112 MiB; with non-temporal
stores from 512 KiB up it takes about half the time (``docs/performance.md``, "Session 35"), and one 64 MiB copy
runs at 12 instead of 6 GB/s.

The threshold is fixed when a process starts (glibc reads ``GLIBC_TUNABLES`` before ``main``), so it goes into
the environment of the processes npusim starts: Ray's (the cards: ``rt/ray/session.py``) and the ranks and their
fork server (``launcher/launch/config.py``). A ``GLIBC_TUNABLES`` that already sets the threshold is left alone;
``NPUSIM_NT_COPY_BYTES=0`` leaves glibc's default. Only x86-64 glibc has the tunable; elsewhere nothing changes.
Small copies (a stage, a reduction's 128 KiB chunk, which is read again at once) stay below the threshold.
"""

from __future__ import annotations

import functools
import os
import platform

from .constants import AclErrorCode as E
from .errors import AclError

ENV = "NPUSIM_NT_COPY_BYTES"
DEFAULT = 512 << 10
TUNABLE = "glibc.cpu.x86_non_temporal_threshold"
GLIBC_MIN = 0x4040            # glibc ignores a smaller threshold


def threshold(env=None) -> int:
    """Bytes from which copies use non-temporal stores (0: glibc's default), from ``NPUSIM_NT_COPY_BYTES``."""
    text = (os.environ if env is None else env).get(ENV, "").strip()
    if not text:
        return DEFAULT
    try:
        value = int(text, 0)
    except ValueError:
        value = -1
    if value != 0 and not GLIBC_MIN <= value < 1 << 48:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{ENV}={text!r}: expected 0 (glibc's default) or a number of "
                                                  f"bytes >= {GLIBC_MIN}")
    return value


@functools.lru_cache(maxsize=1)
def applies() -> bool:
    """Whether this platform's C library has the tunable (glibc on x86-64)."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):     # no confstr, or no such name: not glibc
        libc = ""
    return platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64") and libc.startswith("glibc")


def _setting(tunables: str) -> str | None:
    """The threshold's value in a ``GLIBC_TUNABLES`` string (None: it does not set it)."""
    for part in tunables.split(":"):
        name, _, value = part.partition("=")
        if name == TUNABLE:
            return value
    return None


def tuned(env=None) -> dict:
    """``{"GLIBC_TUNABLES": ...}`` for the environment of a process npusim starts (``env``: the environment it
    starts from), or ``{}``: nothing to add (off, not glibc on x86-64, or the user set the threshold)."""
    env = os.environ if env is None else env
    value = threshold(env)
    current = env.get("GLIBC_TUNABLES", "")
    if not value or not applies() or _setting(current) is not None:
        return {}
    return {"GLIBC_TUNABLES": ":".join(p for p in (current, f"{TUNABLE}={value:#x}") if p)}


def active() -> int:
    """The threshold this process runs with, as its ``GLIBC_TUNABLES`` says (0: glibc's default, or not glibc on
    x86-64). A process npusim started carries it from exec; one started otherwise has what its starter gave it."""
    value = _setting(os.environ.get("GLIBC_TUNABLES", "")) if applies() else None
    try:
        return max(0, int(value, 0)) if value is not None else 0
    except ValueError:
        return 0
