"""What the memory checker says when an access or a free misses: the allocation it hit or missed, the
nearest one, use after free, another card's pointer — always with the address and the sizes."""

from __future__ import annotations

from bisect import bisect_right

from ..addresses import as_int, decode_addr


class MemoryDiagnostics:
    """The slow path of ``DeviceMemory``: building messages (a mixin; reads its sorted allocation lists)."""

    def _containing(self, starts: list[int], allocs: list, p: int):
        i = bisect_right(starts, p) - 1
        if i >= 0 and p <= allocs[i].end:
            return allocs[i]
        return None

    def _nearest(self, p: int) -> str:
        candidates = []
        for starts, allocs in ((self._starts, self._allocs), (self._freed_starts, self._freed)):
            i = bisect_right(starts, p)
            candidates += allocs[max(i - 1, 0):i + 1]
        if not candidates:
            return f"card {self.card} (node {self.node}) has no allocation near it"
        best = min(candidates, key=lambda a: a.start - p if a.start > p else max(p - a.end, 0))
        if best.start > p:
            return f"nearest is {best.describe()}, {best.start - p} bytes above"
        return f"nearest is {best.describe()}, which ends {p - best.end} bytes below"

    def _foreign(self, ptr) -> str | None:
        where = decode_addr(ptr)
        mine = f"card {self.card} of node {self.node}"
        if where is None:
            shown = repr(ptr) if as_int(ptr) is None else f"0x{int(ptr):x}"
            return f"{shown} is not a device address (expected a pointer returned by malloc on {mine})"
        if where != (self.node, self.card):
            return f"0x{int(ptr):x} belongs to card {where[1]} of node {where[0]}, not to {mine}"
        return None

    def _access_miss(self, ptr, nbytes, what: str) -> str:
        if as_int(nbytes) is None or nbytes < 0:
            at = f"0x{int(ptr):x}" if as_int(ptr) is not None else repr(ptr)
            return f"{what}: size {nbytes!r} at {at} is invalid (expected a non-negative int)"
        foreign = self._foreign(ptr)
        if foreign:
            return f"{what} of {nbytes} bytes: {foreign}"
        p = int(ptr)
        closed = " (memory closed)" if self._closed else ""
        alloc = self._containing(self._starts, self._allocs, p)
        if alloc is not None:
            over = p + nbytes - alloc.end
            return (f"{what}: out of bounds: {nbytes} bytes at 0x{p:x} (offset {p - alloc.start}) "
                    f"run {over} bytes past the end of {alloc.describe()}")
        gone = self._containing(self._freed_starts, self._freed, p)
        if gone is not None:
            return (f"{what}: use after free: {nbytes} bytes at 0x{p:x} (offset {p - gone.start}) "
                    f"inside {gone.describe()}")
        return f"{what}: {nbytes} bytes at 0x{p:x} are in no allocation{closed}; {self._nearest(p)}"

    def _free_miss(self, ptr) -> str:
        foreign = self._foreign(ptr)
        if foreign:
            return f"free: {foreign}"
        p = int(ptr)
        gone = self._containing(self._freed_starts, self._freed, p)
        if gone is not None and gone.start == p:
            return (f"free: double free of 0x{p:x} (allocation of {gone.size} bytes, "
                    f"owner {gone.owner!r}, freed earlier)")
        if gone is not None:
            return (f"free: 0x{p:x} is at offset {p - gone.start} inside {gone.describe()}, "
                    f"which was freed earlier")
        alloc = self._containing(self._starts, self._allocs, p)
        if alloc is not None:
            return (f"free: 0x{p:x} is at offset {p - alloc.start} inside {alloc.describe()}, "
                    f"not at its start (free expects the address malloc returned)")
        return f"free: 0x{p:x} was never allocated on card {self.card} (node {self.node}); " \
               f"{self._nearest(p)}"
