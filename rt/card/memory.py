"""A card's device memory: a torch-style caching allocator over memfd segments, always checked.

Two address spaces are kept apart on purpose:

* **Virtual**: every ``malloc`` gets a fresh range from a per-card cursor, followed by an
  unmapped guard gap, and the range is never handed out again (until the 16 TiB per-card
  space wraps around, after which only ranges of no live allocation are reused). A stale,
  out-of-bounds or foreign pointer therefore always lands somewhere the checker can name.
  Addresses encode node and card (``rt/addresses.py``), so a pointer of another card is caught.
* **Physical**: 512-byte-granular blocks carved from memfd segments as in PyTorch's
  CUDACachingAllocator (``rt/card/blocks.py``); the sum of segment sizes never exceeds the
  card's simulated capacity.

Each live allocation maps its virtual range onto one physical block. Lookups bisect sorted
lists of allocation starts (live, and a bounded record of freed ones); nothing is per byte.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left, bisect_right
from collections import deque

import numpy as np

from ..addresses import CARD_SHIFT, OFFSET_LIMIT, as_int, make_addr
from ..constants import MALLOC_POLICY_FLAGS, AclErrorCode, MemMallocPolicy
from ..dtypes import np_dtype
from ..errors import EL0004, AclError
from ..wire.segment import Segment
from .blocks import MIN_BLOCK, BlockPool, round_up, still_busy
from .memcheck import MemoryDiagnostics
from .memstats import MemoryStats

VA_ALIGN = 512              # addresses are 512-aligned (aclrtMalloc promises 64)
VA_GUARD = 512              # unmapped gap after every allocation
VA_BASE = 1 << 20           # first address offset; below it is never mapped

_INVALID_PARAM = AclErrorCode.ACL_ERROR_INVALID_PARAM
_RT_PARAM = AclErrorCode.ACL_ERROR_RT_PARAM_INVALID
_ALLOC_FAIL = AclErrorCode.ACL_ERROR_RT_MEMORY_ALLOCATION
_FREE_FAIL = AclErrorCode.ACL_ERROR_RT_MEMORY_FREE


class Allocation:
    """One malloc: the virtual range ``[start, start + size)`` backed by a physical block."""

    __slots__ = ("start", "size", "rounded", "owner", "policy", "block")

    def __init__(self, start, size, rounded, owner, policy, block):
        self.start = start
        self.size = size          # as requested; bounds checks use this
        self.rounded = rounded    # aclrtMalloc rounding: multiple of 32, plus 32
        self.owner = owner
        self.policy = policy
        self.block = block        # None once freed

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def live(self) -> bool:
        return self.block is not None

    def describe(self) -> str:
        state = "live" if self.live else "freed"
        return f"{state} allocation 0x{self.start:x} of {self.size} bytes (owner {self.owner!r})"

    def __repr__(self) -> str:
        return f"<{self.describe()}>"


class DeviceMemory(MemoryDiagnostics):
    """The device memory of one card: caching allocator + memory checker, thread-safe.

    ``busy`` callables passed to :meth:`free` and :meth:`free_owner` are called with the memory
    lock held: they must be quick, must not block and must not call back into this object.
    """

    def __init__(self, *, node: int, card: int, capacity: int,
                 small_segment: int = 2 << 20, large_segment: int = 20 << 20,
                 prefault: bool = True, freed_history: int = 100_000,
                 va_size: int = OFFSET_LIMIT, va_start: int = VA_BASE):
        make_addr(node, card, 0)  # validates node and card
        for name, value in (("capacity", capacity), ("small_segment", small_segment),
                            ("large_segment", large_segment)):
            if as_int(value) is None or value <= 0 or value % MIN_BLOCK:
                raise AclError(_INVALID_PARAM, f"DeviceMemory: {name} {value!r} is invalid "
                                               f"(expected a positive multiple of {MIN_BLOCK})")
        if not VA_BASE < va_size <= OFFSET_LIMIT or freed_history < 0:
            raise AclError(_INVALID_PARAM, f"DeviceMemory: va_size {va_size} or freed_history "
                                           f"{freed_history} out of range")
        self.node, self.card, self.capacity = node, card, int(capacity)
        self._base = make_addr(node, card, 0)
        self._prefix = self._base >> CARD_SHIFT
        self._lock = threading.Lock()
        self._closed = False
        self._stats = MemoryStats()
        self._pool = BlockPool(node=node, card=card, capacity=self.capacity, small_segment=int(small_segment),
                               large_segment=int(large_segment), prefault=prefault, stats=self._stats)
        # virtual side: live allocations sorted by start, and a bounded record of freed ones
        # a card reused by a new job starts where the last job's addresses ended: none of them is valid again
        self._va_cursor = self._base + (va_start if VA_BASE <= va_start < va_size // 2 else VA_BASE)
        self._va_end = self._base + va_size
        self._wrapped = False
        self._starts: list[int] = []
        self._allocs: list[Allocation] = []
        self._by_owner: dict[object, dict[int, Allocation]] = {}
        self._freed_starts: list[int] = []
        self._freed: list[Allocation] = []
        self._freed_order: deque[Allocation] = deque()
        self._freed_history = freed_history

    # ---- allocation ------------------------------------------------------------------------

    def malloc(self, size: int, policy: int = 0, *, owner=None) -> int:
        """aclrtMalloc: a fresh 512-aligned device address for ``size`` bytes."""
        nbytes = as_int(size)
        if nbytes is None or nbytes <= 0:
            raise AclError(_INVALID_PARAM, f"malloc: size {size!r} is invalid "
                                           f"(expected a positive int number of bytes)")
        policy = _check_policy(policy)
        rounded = ((nbytes - 1) // 32 + 1) * 32 + 32
        with self._lock:
            if self._closed:
                raise AclError(_ALLOC_FAIL, f"malloc: memory of card {self.card} "
                                            f"(node {self.node}) is closed")
            block = self._pool.alloc(nbytes, rounded)
            try:
                start = self._place_va(rounded)
            except AclError:
                self._pool.release(block)
                raise
            alloc = Allocation(start, nbytes, rounded, owner, policy, block)
            i = bisect_left(self._starts, start)
            self._starts.insert(i, start)
            self._allocs.insert(i, alloc)
            if owner is not None:
                self._by_owner.setdefault(owner, {})[start] = alloc
            self._stats.on_malloc(block.pool, block.size, nbytes)
            return start

    # ---- virtual addresses -----------------------------------------------------------------

    def next_va_start(self) -> int:
        """Where a successor's address range should start (past everything this memory handed out)."""
        return round_up(self._va_cursor - self._base + VA_GUARD, VA_ALIGN)

    def _place_va(self, rounded: int) -> int:
        """A fresh virtual range for ``rounded`` bytes plus the guard gap, past every live one."""
        need = rounded + VA_GUARD
        start, wrapped_now = self._va_cursor, False
        while True:
            if start + need > self._va_end:
                if wrapped_now:
                    raise AclError(_ALLOC_FAIL, f"{EL0004} malloc: virtual address space of card {self.card} "
                                                f"(node {self.node}) has no free range of {need} bytes")
                start, wrapped_now, self._wrapped = self._base + VA_BASE, True, True
                continue
            # Before the first wrap the cursor is past every allocation; both checks pass at once.
            i = bisect_right(self._starts, start)
            if i > 0 and self._va_stop(self._allocs[i - 1]) > start:
                start = self._va_stop(self._allocs[i - 1])
            elif i < len(self._starts) and start + need > self._starts[i]:
                start = self._va_stop(self._allocs[i])
            else:
                break
        self._va_cursor = round_up(start + need, VA_ALIGN)
        if self._wrapped:
            self._forget_freed(start, self._va_cursor)
        return start

    @staticmethod
    def _va_stop(alloc: Allocation) -> int:
        return round_up(alloc.start + alloc.rounded + VA_GUARD, VA_ALIGN)

    def _remember_freed(self, alloc: Allocation) -> None:
        if self._freed_history == 0:
            return
        i = bisect_left(self._freed_starts, alloc.start)
        self._freed_starts.insert(i, alloc.start)
        self._freed.insert(i, alloc)
        self._freed_order.append(alloc)
        if len(self._freed_order) > self._freed_history:
            # Trim in batches of 1/8 so the O(n) rebuild is amortised to O(1) per free.
            drop = {id(self._freed_order.popleft())
                    for _ in range(max(1, self._freed_history // 8))}
            kept = [a for a in self._freed if id(a) not in drop]
            self._freed = kept
            self._freed_starts = [a.start for a in kept]

    def _forget_freed(self, lo: int, hi: int) -> None:
        """Drop freed records overlapping a reused range (only after the address space wrapped)."""
        i = bisect_left(self._freed_starts, lo)
        if i > 0 and self._va_stop(self._freed[i - 1]) > lo:
            i -= 1
        j = bisect_left(self._freed_starts, hi, lo=i)
        del self._freed_starts[i:j], self._freed[i:j]

    # ---- free ------------------------------------------------------------------------------

    def free(self, ptr: int, *, owner=None, busy=None) -> None:
        """aclrtFree. ``owner=None`` skips the ownership check; ``busy()`` True defers reuse."""
        with self._lock:
            p = as_int(ptr)
            i = bisect_right(self._starts, p) - 1 if p is not None else -1
            if i < 0 or self._allocs[i].start != p:
                raise AclError(_FREE_FAIL, self._free_miss(ptr))
            alloc = self._allocs[i]
            if owner is not None and alloc.owner != owner:
                raise AclError(_FREE_FAIL, f"free: 0x{p:x} is {alloc.describe()}, which belongs to "
                                           f"owner {alloc.owner!r}, not to the caller {owner!r}")
            self._free_alloc(i, busy)

    def _free_alloc(self, i: int, busy) -> None:
        alloc = self._allocs[i]
        del self._starts[i], self._allocs[i]
        if alloc.owner is not None:
            owned = self._by_owner[alloc.owner]
            del owned[alloc.start]
            if not owned:
                del self._by_owner[alloc.owner]
        block, alloc.block = alloc.block, None
        self._remember_freed(alloc)
        self._stats.on_free(block.pool, block.size, alloc.size)
        if busy is not None and still_busy(busy):
            self._pool.defer(block, busy)
        else:
            self._pool.retire(block)

    def free_owner(self, owner, *, busy=None) -> int:
        """Free every allocation of ``owner``, then release fully free segments; returns the count."""
        with self._lock:
            starts = list(self._by_owner.get(owner, ()))
            for start in starts:
                self._free_alloc(bisect_left(self._starts, start), busy)
            self._pool.release_free_segments()
            return len(starts)

    def empty_cache(self) -> None:
        """Release cached segments that hold no live (or still busy) block."""
        with self._lock:
            self._pool.release_cached()

    # ---- checked access --------------------------------------------------------------------

    def _find(self, ptr, nbytes, what: str) -> Allocation:
        """The live allocation holding ``[ptr, ptr + nbytes)``, or raise 107000 saying why not."""
        if type(ptr) is not int or type(nbytes) is not int:  # numpy integers are fine too
            p, n = as_int(ptr), as_int(nbytes)
            if p is None or n is None:
                raise AclError(_RT_PARAM, self._access_miss(ptr, nbytes, what))
            ptr, nbytes = p, n
        if ptr >> CARD_SHIFT == self._prefix and nbytes >= 0:
            i = bisect_right(self._starts, ptr) - 1
            if i >= 0 and ptr + nbytes <= self._allocs[i].end:
                return self._allocs[i]
        raise AclError(_RT_PARAM, self._access_miss(ptr, nbytes, what))

    def view(self, ptr: int, nbytes: int, *, what: str = "access") -> np.ndarray:
        """A writable 1-D uint8 view of ``nbytes`` of device memory at ``ptr``, bounds-checked."""
        with self._lock:
            alloc = self._find(ptr, nbytes, what)
            block = alloc.block
            offset = block.offset + (int(ptr) - alloc.start)
            return block.segment.array[offset:offset + int(nbytes)]

    def typed_view(self, ptr: int, shape, dtype, *, what: str = "access") -> np.ndarray:
        """A checked view of device memory at ``ptr`` as an array of ``shape`` and ``dtype``."""
        dt = np_dtype(dtype)
        try:
            dims = (shape,) if as_int(shape) is not None else tuple(shape)
        except TypeError:
            dims = (None,)
        if any(as_int(d) is None or d < 0 for d in dims):
            raise AclError(_RT_PARAM, f"{what}: shape {shape!r} is invalid "
                                      f"(expected non-negative int dimensions)")
        dims = tuple(int(d) for d in dims)
        nbytes = math.prod(dims) * dt.itemsize
        return self.view(ptr, nbytes, what=what).view(dt).reshape(dims)

    def locate(self, ptr: int, nbytes: int, *, what: str = "access") -> tuple[int, int]:
        """``(segment id, offset)`` of a checked range, for peers that map the segment."""
        with self._lock:
            alloc = self._find(ptr, nbytes, what)
            return alloc.block.segment.id, alloc.block.offset + (int(ptr) - alloc.start)

    def allocation(self, ptr: int) -> Allocation:
        """The live allocation containing ``ptr`` (checked)."""
        with self._lock:
            return self._find(ptr, 0, "allocation")

    def segment(self, seg_id: int) -> Segment:
        """A live segment of this card by id."""
        with self._lock:
            seg = self._pool.segments.get(seg_id)
        if seg is None:
            raise AclError(_RT_PARAM, f"segment: card {self.card} (node {self.node}) has no "
                                      f"segment {seg_id!r} (live: {sorted(self._pool.segments)})")
        return seg

    # ---- reporting and teardown -------------------------------------------------------------

    def mem_info(self) -> tuple[int, int]:
        """``(free, total)`` as aclrtGetMemInfo: free is capacity minus reserved."""
        with self._lock:
            return self.capacity - self._stats.current("reserved_bytes"), self.capacity

    def stats(self) -> dict:
        """Counters in the key style of torch.cuda.memory_stats()."""
        with self._lock:
            return self._stats.as_dict()

    def owner_usage(self) -> dict:
        """``{owner: (live allocations, bytes of their blocks)}``: the device memory each owner holds now."""
        with self._lock:
            return {owner: (len(allocs), sum(a.block.size for a in allocs.values()))
                    for owner, allocs in self._by_owner.items()}

    def close(self) -> None:
        """Release every segment; every pointer of this card becomes invalid. Idempotent."""
        with self._lock:
            self._closed = True
            # Free through the normal path so stats and the freed record stay truthful:
            # a pointer used after reset_device is reported as a use after free.
            while self._allocs:
                self._free_alloc(len(self._allocs) - 1, None)
            self._pool.close()


_POLICIES = frozenset(int(m) for m in MemMallocPolicy)


def _check_policy(policy) -> int:
    p = as_int(policy)
    if p is None or p < 0 or (p & ~MALLOC_POLICY_FLAGS) not in _POLICIES:
        valid = ", ".join(f"{m.name}={m.value}" for m in MemMallocPolicy)
        raise AclError(_INVALID_PARAM,
                       f"malloc: policy {policy!r} is invalid (expected one of {valid}, optionally "
                       f"OR-ed with the flags 0x{MALLOC_POLICY_FLAGS:x})")
    return p
