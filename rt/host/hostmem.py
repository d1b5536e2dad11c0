"""Pinned host memory: ``HostBuffer`` is a shared-memory mapping the card can copy to and from directly.

It subclasses ``mmap.mmap`` so it *is* a writable buffer (``np.frombuffer(buf, dtype)`` views it) and
is backed by a memfd, so no file under /dev/shm exists that could leak; the card maps the same pages
from the fd passed over the command channel.
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
import os
import threading

import numpy as np

from .. import memlimit
from ..args import shown
from ..constants import AclErrorCode
from ..errors import AclError
from ..wire.segment import check_host_memory

_ids = itertools.count(1)


class PinnedBudget:
    """How much pinned host memory this process may hold: ``limit`` bytes (the config's
    ``[host] pinned_limit_bytes``; 0 = half of the machine's RAM, or of the memory cgroup's limit in a
    container), never more than the host (or the cgroup) has free."""

    def __init__(self):
        self.limit = 0
        self.in_use = 0
        self._lock = threading.Lock()

    def reserve(self, size: int, what: str) -> None:
        mem = memlimit.budget()                  # read once: it is a few /proc and cgroup files
        with self._lock:
            limit = self.limit or mem.total // 2
            if self.in_use + size > limit:
                raise AclError(AclErrorCode.ACL_ERROR_RT_MEMORY_ALLOCATION,
                               f"{what}: {size} bytes of pinned host memory requested; this process holds "
                               f"{self.in_use} of its {limit}-byte limit ([host] pinned_limit_bytes of the config)")
            check_host_memory(size, what, mem)
            self.in_use += size

    def release(self, size: int) -> None:
        with self._lock:
            self.in_use = max(0, self.in_use - size)


PINNED = PinnedBudget()


class HostBuffer(mmap.mmap):
    """A pinned host buffer returned by ``rt.malloc_host``; free it with ``rt.free_host``."""

    def __new__(cls, size: int):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 0 < size < 1 << 63:
            raise AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM,
                           f"malloc_host: size {shown(size)} must be a positive int below 2**63")
        size = int(size)
        PINNED.reserve(size, "malloc_host")
        try:
            fd = os.memfd_create(f"npusim-host-{os.getpid()}", os.MFD_CLOEXEC)
        except OSError as e:
            PINNED.release(size)
            raise AclError(AclErrorCode.ACL_ERROR_RT_MEMORY_ALLOCATION, f"malloc_host: {size} bytes: {e}") from None
        try:
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)   # pre-fault: first touch of fresh pages is ~40x slower
            self = super().__new__(cls, fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            os.close(fd)
            PINNED.release(size)
            raise AclError(AclErrorCode.ACL_ERROR_RT_MEMORY_ALLOCATION,
                           f"malloc_host: cannot back {size} bytes of pinned memory: {e}") from None
        except BaseException:
            os.close(fd)
            PINNED.release(size)
            raise
        self.fd = fd
        self.id = next(_ids) | (os.getpid() << 32)
        self.nbytes = size
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self))
        self.freed = False
        return self

    def __init__(self, size: int):  # mmap's __init__ takes no part; state is set in __new__
        pass

    def release(self) -> None:
        """Unmap and close; later use raises ValueError (mmap closed)."""
        if self.freed:
            raise AclError(AclErrorCode.ACL_ERROR_RT_MEMORY_FREE, f"free_host: host buffer {self.id:#x} freed twice")
        self.freed = True
        PINNED.release(self.nbytes)
        try:
            self.close()
        except BufferError:
            pass  # numpy views still alive: pages go when the last view does
        try:
            os.close(self.fd)
        except OSError:
            pass

    def __del__(self):
        # Dropped without free_host: give the fd and the pinned budget back (the pages go with the mapping).
        if not getattr(self, "freed", True):
            try:
                self.release()
            except Exception:  # noqa: BLE001 - never raise from a finalizer
                pass

    def __repr__(self) -> str:
        state = "freed" if self.freed else f"{self.nbytes} bytes"
        return f"HostBuffer(id={self.id:#x}, {state})"


def pinned_region(obj) -> tuple[HostBuffer, int, int] | None:
    """If ``obj`` is a HostBuffer or a numpy/memoryview view into one, return (buffer, offset, nbytes)."""
    if isinstance(obj, HostBuffer):
        return obj, 0, obj.nbytes
    base = obj
    if isinstance(obj, memoryview):
        base = obj.obj
        arr = np.frombuffer(obj, dtype=np.uint8) if obj.contiguous else None
    else:
        arr = obj if isinstance(obj, np.ndarray) else None
    if arr is None:
        return None
    while isinstance(base, (np.ndarray, memoryview)):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    if not isinstance(base, HostBuffer) or base.freed or not arr.flags.c_contiguous:
        return None
    offset = arr.ctypes.data - base.address
    if not 0 <= offset <= base.nbytes - arr.nbytes:
        return None
    return base, offset, arr.nbytes
