"""Which host addresses this process has mapped, and with what permission (``/proc/self/maps``).

Read before npusim touches memory at an address a program passed as a plain int (a pyACL host pointer from
``torch.Tensor.data_ptr()``, ``ctypes``, ``ndarray.ctypes.data``; a data buffer's address): an unmapped or
read-only range is refused with the caller's code instead of a SIGSEGV/SIGABRT of the whole process.

The map is parsed once and cached; a range the cache does not grant is looked up again in a fresh map (the
program mapped something new). A range the cache does grant may have been unmapped or remapped with other
permissions since (a freed buffer's address reused by a read-only mapping): it is confirmed by letting the
kernel copy one byte per page out of it — and, for a write, back in unchanged — with ``process_vm_readv`` /
``process_vm_writev``, which fail with EFAULT where a plain access would kill the process; a failed probe is
a miss. Nothing here reads or writes the memory itself.
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import mmap
import os
import threading

MAPS = "/proc/self/maps"
PAGE = mmap.PAGESIZE
ADDRESS_END = 1 << 64


class _Map:
    """A parsed memory map: sorted, non-overlapping ``(lo, hi, perms)`` ranges."""

    def __init__(self, ranges: list[tuple[int, int, bytes]]):
        self.ranges = ranges
        self.los = [r[0] for r in ranges]

    @classmethod
    def read(cls) -> _Map | None:
        try:
            with open(MAPS, "rb") as f:
                lines = f.read().splitlines()
        except OSError:
            return None
        ranges = []
        for line in lines:
            bounds, perms = line.split(b" ", 2)[:2]
            lo, hi = (int(x, 16) for x in bounds.split(b"-"))
            ranges.append((lo, hi, perms))
        return cls(ranges)

    def problem(self, address: int, nbytes: int, write: bool) -> str | None:
        """Why ``[address, address + nbytes)`` cannot be accessed according to this map, or None."""
        need, end = address, address + nbytes
        i = max(bisect.bisect_right(self.los, need) - 1, 0)
        for lo, hi, perms in self.ranges[i:]:          # adjacent pieces of one region come one after another
            if hi <= need:
                continue
            if lo > need:
                break
            if perms[:1] != b"r" or write and perms[1:2] != b"w":
                return (f"the memory at 0x{need:x} is mapped {perms.decode()[:3]}, not "
                        f"{'writable' if write else 'readable'}")
            need = hi
            if need >= end:
                return None
        return f"0x{need:x} is not mapped in this process"


_cache: _Map | None = None
_lock = threading.Lock()


class _Iovec(ctypes.Structure):
    _fields_ = (("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t))


def _libc():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        calls = lib.process_vm_readv, lib.process_vm_writev
    except (OSError, AttributeError):
        return None
    for fn in calls:
        fn.argtypes = (ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                       ctypes.c_ulong)
        fn.restype = ctypes.c_ssize_t
    return calls


_vm = _libc()
IOV_MAX = 1024


def _probe(address: int, nbytes: int, write: bool) -> bool:
    """Whether every page of the range can still be read (and written): one byte per page is copied out by
    the kernel (``process_vm_readv``, which fails with EFAULT where a plain access would be SIGSEGV) and, for
    ``write``, copied back unchanged (``process_vm_writev``) — the caller is about to overwrite the range, so
    writing its own bytes back changes nothing. Without the calls (not Linux) the cached map is trusted."""
    if _vm is None:
        return True
    starts = [address] + list(range(address - address % PAGE + PAGE, address + nbytes, PAGE))
    pid = os.getpid()
    for at in range(0, len(starts), IOV_MAX):
        chunk = starts[at:at + IOV_MAX]
        remote = (_Iovec * len(chunk))(*[_Iovec(a, 1) for a in chunk])
        scratch = ctypes.create_string_buffer(len(chunk))
        local = (_Iovec * 1)(_Iovec(ctypes.addressof(scratch), len(chunk)))
        if _vm[0](pid, local, 1, remote, len(chunk), 0) != len(chunk):
            return False
        if write and _vm[1](pid, local, 1, remote, len(chunk), 0) != len(chunk):
            return False
    return True


def unmapped(address: int, nbytes: int, write: bool) -> str | None:
    """Why ``[address, address + nbytes)`` cannot be accessed (read, or written if ``write``) in this process,
    or None if every byte can. Without a readable map (not Linux) nothing is refused."""
    global _cache
    if address < 0 or nbytes < 0 or address + nbytes > ADDRESS_END:
        return f"0x{address:x} + {nbytes} bytes is not a range of 64-bit addresses"
    if nbytes == 0:
        return None
    cached = _cache
    if cached is not None and cached.problem(address, nbytes, write) is None and _probe(address, nbytes, write):
        return None
    fresh = _Map.read()                                # a miss: the program may have mapped or unmapped since
    if fresh is None:
        return None
    with _lock:
        _cache = fresh
    return fresh.problem(address, nbytes, write)
