"""Host-side views of a context's own device memory, for work the host may do on the card's behalf.

The card owns the memory; this process maps the same shared-memory segments (fds passed once over the
channel) so that a fast path running in the host process — collectives on an idle stream, see
``hccl/hostpath.py`` — reads and writes exactly the bytes a stream task would. Only allocations this
context made and has not freed are ever viewed: anything else (another process's buffer, a freed or
out-of-range pointer) returns None and the caller takes the card path, where the card's memory checker
reports the problem. A segment stays mapped while an allocation we resolved lives in it.
"""

from __future__ import annotations

import bisect
import contextlib
import threading

import numpy as np

from ..constants import AclErrorCode
from ..errors import AclError
from ..wire.segment import close_fds, map_received

FREE_WAIT = 60.0        # seconds a free waits for a host-side collective still using this context's memory


class DeviceMap:
    """The live allocations of one context, and lazily resolved host views of them."""

    def __init__(self, client):
        self.client = client
        self._lock = threading.Lock()
        self._starts: list[int] = []              # sorted allocation starts
        self._sizes: dict[int, int] = {}          # start -> requested size
        self._resolved: dict[int, tuple[int, int]] = {}   # start -> (segment id, offset of start)
        self._segments: dict[int, np.ndarray] = {}        # segment id -> uint8 view of the mapping
        self._uses: dict[int, int] = {}                   # segment id -> resolved allocations in it
        self._busy = 0                                    # host-side operations using views right now
        self._idle = threading.Condition(self._lock)
        self._freeing = 0                                 # frees waiting for ``_busy`` to drop to 0
        self.generation = 0          # bumped whenever an allocation is forgotten: views taken before may be stale

    @contextlib.contextmanager
    def hold(self):
        """While held, no allocation of this context is forgotten (``remove`` waits): a free from another
        thread cannot pull memory from under a collective this process is running on the card's behalf."""
        self.enter()
        try:
            yield self
        finally:
            self.leave()

    def enter(self) -> None:
        """``hold`` without a context manager (hot paths): pair with :meth:`leave` in a ``finally``."""
        with self._lock:
            self._busy += 1

    def leave(self) -> None:
        with self._lock:
            self._busy -= 1
            if not self._busy and self._freeing:
                self._idle.notify_all()

    def close(self) -> None:
        """The context is gone: forget everything (mappings go with the last view)."""
        with self._lock:
            self.generation += 1
            self._starts.clear()
            self._sizes.clear()
            self._resolved.clear()
            self._segments.clear()
            self._uses.clear()

    def add(self, ptr: int, size: int) -> None:
        """``ptr`` was just allocated by this context (``size`` bytes)."""
        with self._lock:
            bisect.insort(self._starts, ptr)
            self._sizes[ptr] = size

    def size(self, ptr: int) -> int | None:
        """The requested size of the live allocation starting at ``ptr`` (None: not one of ours)."""
        return self._sizes.get(ptr)

    def remove(self, ptr: int) -> None:
        """``ptr`` is about to be freed: never view it again (before the card is asked, so no race)."""
        with self._lock:
            if ptr in self._sizes and self._busy:
                self._freeing += 1
                try:
                    idle = self._idle.wait_for(lambda: not self._busy, FREE_WAIT)
                finally:
                    self._freeing -= 1
            else:
                idle = True
            if not idle:
                raise AclError(AclErrorCode.ACL_ERROR_RT_MEMORY_FREE,
                               f"free: {ptr:#x} is still in use by a collective this process runs after "
                               f"{FREE_WAIT:g} s (another thread is inside an HCCL call on this context)")
            if self._sizes.pop(ptr, None) is None:
                return
            self.generation += 1
            del self._starts[bisect.bisect_left(self._starts, ptr)]
            where = self._resolved.pop(ptr, None)
            if where is not None:
                seg = where[0]
                self._uses[seg] -= 1
                if not self._uses[seg]:              # last view into it: unmap (the card may release it)
                    del self._uses[seg], self._segments[seg]

    def _find(self, ptr: int, nbytes: int) -> tuple[int | None, tuple[int, int] | None]:
        """The start of the live allocation ``[ptr, ptr + nbytes)`` lies in (None: none) and where that start is on
        the card, if already resolved."""
        with self._lock:
            i = bisect.bisect_right(self._starts, ptr) - 1
            if i < 0:
                return None, None
            start = self._starts[i]
            if ptr + nbytes > start + self._sizes[start]:
                return None, None
            return start, self._resolved.get(start)

    def view(self, ptr: int, nbytes: int) -> np.ndarray | None:
        """uint8 view of ``[ptr, ptr + nbytes)`` if it lies inside one of our live allocations, else None."""
        start, where = self._find(ptr, nbytes)
        if start is None:
            return None
        if where is None:
            where = self._resolve(start)
            if where is None:
                return None
        seg, off = where
        base = off + (ptr - start)
        return self._segments[seg][base: base + nbytes]

    def where(self, ptr: int, nbytes: int) -> tuple[int, int] | None:
        """``(segment id, offset)`` on the card of ``[ptr, ptr + nbytes)`` — what the card's ``locate`` answers —
        if it lies inside one of our live allocations already viewed (:meth:`view`), else None."""
        start, where = self._find(ptr, nbytes)
        return None if where is None else (where[0], where[1] + ptr - start)

    def _resolve(self, start: int) -> tuple[int, int] | None:
        """Ask the card where allocation ``start`` lives; map its segment (fd sent with the reply)."""
        reply, fds = self.client.call("locate_own", start, want_fds=True)
        if reply is None:
            close_fds(fds)
            return None
        seg, off, seg_size = reply
        with self._lock:
            if start not in self._sizes:           # freed meanwhile by another thread
                close_fds(fds)
                return None
            if seg in self._segments:
                close_fds(fds)
            else:
                self._segments[seg] = map_received(fds, seg_size)
                self._uses[seg] = 0
            if start not in self._resolved:
                self._resolved[start] = (seg, off)
                self._uses[seg] += 1
            return self._resolved[start]
