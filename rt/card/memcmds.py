"""The card's memory part: malloc/free, host buffers it maps, synchronous and stream-ordered copies and memsets,
and where allocations live (for peers and for the owning host's views)."""

from __future__ import annotations

import mmap
import os

import numpy as np

from ..constants import AclErrorCode as E
from ..errors import AclError
from .dispatch import with_fds


def close_map(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        pass  # views still alive in a queued task; the mapping goes with them


class MemoryCommands:
    """The memory commands and tasks of ``card``, in the tables ``commands`` and ``tasks`` (wire name →
    handler, as ``Card.handle`` calls them)."""

    def __init__(self, card):
        self.card = card
        self.memory = card.memory
        self.commands = {
            "malloc": self.c_malloc,
            "free": self.c_free,
            "mem_info": self.c_mem_info,
            "memory_stats": self.c_memory_stats,
            "empty_cache": self.c_empty_cache,
            "host_register": self.c_host_register,
            "host_unregister": self.c_host_unregister,
            "memcpy": self.c_memcpy,
            "memset": self.c_memset,
            "locate": self.c_locate,
            "locate_own": self.c_locate_own,
            "export_segment": self.c_export_segment,
        }
        self.tasks = {
            "memcpy": self.t_memcpy,
            "memset": self.t_memset,
        }

    def c_malloc(self, conn, size, policy=0):
        return self.memory.malloc(size, policy, owner=conn.id)

    def c_free(self, conn, ptr):
        card = self.card
        with card.lock:
            streams = list(card.streams.values()) + [d for c in card.conns.values() for d in c.draining]
        pending = [s.busy_until(s.enqueued) for s in streams if not s.idle()]
        busy = (lambda: any(p() for p in pending)) if pending else None
        self.memory.free(ptr, owner=conn.id, busy=busy)

    def c_mem_info(self, conn):
        return list(self.memory.mem_info())

    def c_memory_stats(self, conn):
        return self.memory.stats()

    def c_empty_cache(self, conn):
        self.memory.empty_cache()

    def c_host_register(self, conn, buf_id, size):
        if not conn.pending_fds:
            raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"host_register: no descriptor arrived for buffer {buf_id:#x}")
        fd = conn.pending_fds.pop(0)
        try:
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
        conn.host_buffers[buf_id] = (mm, np.frombuffer(mm, np.uint8))

    def c_host_unregister(self, conn, buf_id):
        entry = conn.host_buffers.pop(buf_id, None)
        if entry is not None:
            close_map(entry[0])

    def c_memcpy(self, conn, dst, src, count):
        """Synchronous copy, not ordered with queued stream work (as aclrtMemcpy)."""
        if dst[0] == "ret":
            return bytes(self.card.region(conn, src, count, "memcpy src"))
        np.copyto(self.card.region(conn, dst, count, "memcpy dst"), self.card.region(conn, src, count, "memcpy src"))

    def c_memset(self, conn, ptr, value, count):
        self.card.device_view(ptr, count, "memset")[:] = value

    def c_locate(self, conn, ptr, nbytes, what):
        """For peers: where a range of this card's memory lives (segment id, offset, segment size)."""
        seg, off = self.memory.locate(ptr, nbytes, what=what)
        return [seg, off, self.memory.segment(seg).size]

    def c_locate_own(self, conn, ptr):
        """Where this connection's live allocation ``ptr`` lives — ``[segment, offset, segment size]`` plus the
        segment's fd — so the host can view it (``rt/host/hostview.py``); None for anything it does not own."""
        try:
            alloc = self.memory.allocation(ptr)
        except AclError:
            return None
        if alloc.owner != conn.id or alloc.start != ptr:
            return None
        seg_id, off = self.memory.locate(ptr, alloc.size)
        seg = self.memory.segment(seg_id)
        return with_fds([seg_id, off, seg.size], [seg.fd])

    def c_export_segment(self, conn, seg_id):
        seg = self.memory.segment(seg_id)
        return with_fds(seg.size, [seg.fd])

    def t_memcpy(self, conn, stream, dst, src, count):
        d = self.card.region(conn, dst, count, "memcpy_async dst")
        s = self.card.region(conn, src, count, "memcpy_async src")
        return lambda: np.copyto(d, s)

    def t_memset(self, conn, stream, ptr, value, count):
        d = self.card.device_view(ptr, count, "memset_async")

        def run():
            d[:] = value
        return run
