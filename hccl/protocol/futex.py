"""Sleeping on a word of shared memory (Linux futex) so idle cards burn no CPU and wake in microseconds.

Waiters on a control block spin-yield briefly, then flag themselves as sleeping and futex-wait on the
block's wake word; whoever changes state bumps the word and wakes sleepers only if any flagged
themselves, so the fast path costs no system call. A lost wake-up (x86 may reorder a store before a
later load) costs at most one bounded sleep, never a hang: every sleep has a short timeout.
"""

from __future__ import annotations

import ctypes
import platform

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())
FUTEX_WAIT, FUTEX_WAKE = 0, 1          # shared (not PRIVATE): the word lives in memory mapped by several processes


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _syscall = _libc.syscall
    _syscall.restype = ctypes.c_long
except (OSError, AttributeError):
    _syscall = None

AVAILABLE = _syscall is not None and _SYS_FUTEX is not None


_timeouts: dict = {}              # timeout -> a pointer to its timespec (waits use a few distinct timeouts)


def wait(address: ctypes.c_void_p, expected: int, timeout: float) -> None:
    """Sleep while the int32 at ``address`` (made once by :func:`pointer`) equals ``expected`` (at most ``timeout``
    seconds)."""
    ts = _timeouts.get(timeout)
    if ts is None:
        if len(_timeouts) > 64:
            _timeouts.clear()
        ts = _timeouts[timeout] = ctypes.pointer(_Timespec(int(timeout), int((timeout % 1) * 1e9)))
    _syscall(_SYS_FUTEX, address, FUTEX_WAIT, ctypes.c_int(expected), ts, None, 0)


def pointer(address: int) -> ctypes.c_void_p:
    """``address`` as :func:`wait` and :func:`wake` take it: converted once, by the caller that keeps the word."""
    return ctypes.c_void_p(address)


def wake(address: ctypes.c_void_p, count: int = 1 << 30) -> None:
    _syscall(_SYS_FUTEX, address, FUTEX_WAKE, ctypes.c_int(count), None, None, 0)
