"""Shared-memory segments backed by memfd: the physical memory a card's allocator carves up.

A segment is an anonymous ``memfd_create`` file mapped ``MAP_SHARED``. It has no name in
/dev/shm, so it cannot outlive the processes that hold its fd or a mapping — nothing to clean
up on any exit path. Peer cards and host processes on the same node map the same pages from
the fd (passed over a Unix socket with SCM_RIGHTS) via :meth:`Segment.attach`.

First touch of fresh shared memory runs at ~0.4-0.5 GB/s on the target machines against
~15-25 GB/s for warm pages, so by default a segment is prefaulted when it is created:
``posix_fallocate`` allocates the pages up front (and fails with ENOSPC now rather than with
SIGBUS later) and ``MAP_POPULATE`` builds the page tables, so the first copy runs at memory
speed (measured: 0.5 → 27 GB/s first-write bandwidth on a 256 MiB segment).
"""

from __future__ import annotations

import itertools
import mmap
import os

import numpy as np

from .. import memlimit
from ..constants import AclErrorCode
from ..errors import AclError

# Process-wide ids: a card's segments are named (card, id) when peers ask to map them.
_next_id = itertools.count(1)


class Segment:
    """A shared-memory segment backed by os.memfd_create, mapped MAP_SHARED, viewable as uint8."""

    def __init__(self, size: int, *, name: str = "npusim", prefault: bool = True):
        _check_size(size, "Segment")
        check_host_memory(size, f"Segment {name!r}")
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            if prefault:
                os.posix_fallocate(fd, 0, size)
            self._map(fd, size, next(_next_id), prefault)
        except OSError as exc:
            os.close(fd)
            raise AclError(AclErrorCode.ACL_ERROR_RT_MEMORY_ALLOCATION,
                           f"Segment: cannot create a {size}-byte shared-memory segment "
                           f"{name!r}: {exc}") from None
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, fd: int, size: int, *, seg_id: int | None = None,
               prefault: bool = True) -> "Segment":
        """Map a segment fd received from another process; the fd is dup'ed and the dup owned.

        ``seg_id`` keeps the owner's id (so both sides name the segment alike); by default a
        fresh local id is assigned.
        """
        _check_size(size, "Segment.attach")
        own = os.dup(fd)
        try:
            actual = os.fstat(own).st_size
            if actual < size:
                raise AclError(AclErrorCode.ACL_ERROR_RT_PARAM_INVALID,
                               f"Segment.attach: fd {fd} holds {actual} bytes, "
                               f"fewer than the {size} requested")
            seg = cls.__new__(cls)
            seg._map(own, size, next(_next_id) if seg_id is None else int(seg_id), prefault)
            return seg
        except OSError as exc:
            os.close(own)
            raise AclError(AclErrorCode.ACL_ERROR_RT_PARAM_INVALID,
                           f"Segment.attach: cannot map fd {fd} ({size} bytes): {exc}") from None
        except BaseException:
            os.close(own)
            raise

    def _map(self, fd: int, size: int, seg_id: int, prefault: bool) -> None:
        flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if prefault else 0)
        self._mmap = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.id = seg_id
        self.size = size
        self.fd = fd
        self.array = np.frombuffer(self._mmap, dtype=np.uint8)
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Unmap and close the fd; idempotent and safe while numpy views still exist."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self.array = None
        mm, self._mmap = self._mmap, None
        try:
            mm.close()
        except BufferError:
            # Views handed out earlier still export the buffer. Dropping our reference is
            # enough: the mapping is unmapped when the last view is garbage-collected.
            pass
        os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> "Segment":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        # A segment dropped without close() must not leak its fd.
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"fd={self.fd}"
        return f"Segment(id={self.id}, size={self.size}, {state})"


def host_headroom(total: int) -> int:
    """Host memory npusim never takes for segments: the rest of the machine must keep running."""
    return max(256 << 20, total // 20)


def check_host_memory(nbytes: int, what: str, mem: memlimit.MemoryBudget | None = None) -> None:
    """Refuse (207001, naming the numbers) a segment the host cannot back: pre-faulting it would have the
    kernel's OOM killer end the process instead of an error. Inside a memory cgroup (a container) its limit
    is the bound, not the machine's RAM (``rt/memlimit.py``). ``mem``: a budget the caller just read."""
    mem = mem or memlimit.budget()
    if nbytes > mem.available - host_headroom(mem.total):
        raise AclError(AclErrorCode.ACL_ERROR_RT_MEMORY_ALLOCATION,
                       f"{what}: {nbytes} bytes requested, but {mem.describe()}; {host_headroom(mem.total)} "
                       f"are kept free for the rest of the {'machine' if mem.cgroup is None else 'cgroup'}")


def _check_size(size, where: str) -> None:
    if type(size) is not int or size <= 0:
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM,
                       f"{where}: size {size!r} is invalid (expected a positive int number of bytes)")


def map_received(fds, size: int) -> np.ndarray:
    """uint8 view of a shared mapping of ``fds[0]`` (``size`` bytes), as a card's reply delivers it; every
    fd in ``fds`` is closed (the mapping keeps the memory). Raises OSError if it cannot be mapped."""
    try:
        if not fds:
            raise OSError(f"no file descriptor arrived for a {size}-byte mapping")
        return np.frombuffer(mmap.mmap(fds[0], size, flags=mmap.MAP_SHARED), np.uint8)
    finally:
        close_fds(fds)


def close_fds(fds) -> None:
    for fd in fds:
        os.close(fd)
