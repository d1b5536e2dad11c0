"""A card's device memory: a torch-style caching allocator over memfd segments, always checked.

Two address spaces are kept apart on purpose:

* **Virtual**: every ``malloc`` gets a fresh range from a per-card cursor, followed by an
  unmapped guard gap, and the range is never handed out again (until the 16 TiB per-card
  space wraps around, after which only ranges of no live allocation are reused). A stale,
  out-of-bounds or foreign pointer therefore always lands somewhere the checker can name.
  Addresses encode node and card (:func:`make_addr`), so a pointer of another card is caught.
* **Physical**: 512-byte-granular blocks carved from :class:`~rt.segment.Segment` s, as in
  PyTorch's CUDACachingAllocator: blocks of at most 1 MiB come from a small pool of
  ``small_segment``-byte segments, 1-10 MiB from ``large_segment`` segments, bigger requests
  get their own segment rounded up to 2 MiB; best fit, split, merge with free neighbours on
  free, segments cached until ``empty_cache``. The sum of segment sizes never exceeds the
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

from .constants import MALLOC_POLICY_FLAGS, AclErrorCode, MemMallocPolicy, np_dtype
from .errors import AclError
from .segment import Segment

ADDR_TAG = 1 << 60
_NODE_SHIFT = 52
_CARD_SHIFT = 44
_OFFSET_LIMIT = 1 << _CARD_SHIFT
_ID_LIMIT = 1 << (_NODE_SHIFT - _CARD_SHIFT)  # node and card ids are 8 bits each

MIN_BLOCK = 512             # kMinBlockSize: physical blocks are multiples of this
SMALL_SIZE = 1 << 20        # kSmallSize: blocks up to this come from the small pool
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: below this, carve from a large_segment
ROUND_LARGE = 2 << 20       # kRoundLarge: bigger requests get their own segment of this granule
VA_ALIGN = 512              # addresses are 512-aligned (aclrtMalloc promises 64)
VA_GUARD = 512              # unmapped gap after every allocation
VA_BASE = 1 << 20           # first address offset; below it is never mapped

_INVALID_PARAM = AclErrorCode.ACL_ERROR_INVALID_PARAM
_RT_PARAM = AclErrorCode.ACL_ERROR_RT_PARAM_INVALID
_ALLOC_FAIL = AclErrorCode.ACL_ERROR_RT_MEMORY_ALLOCATION
_FREE_FAIL = AclErrorCode.ACL_ERROR_RT_MEMORY_FREE


def make_addr(node: int, card: int, offset: int) -> int:
    """The device address of byte ``offset`` of card ``card`` on node ``node``."""
    if not (0 <= node < _ID_LIMIT and 0 <= card < _ID_LIMIT and 0 <= offset < _OFFSET_LIMIT):
        raise AclError(_RT_PARAM, f"make_addr: node {node}, card {card}, offset {offset} out of range "
                                  f"(expected node, card in [0, {_ID_LIMIT}), offset in [0, 2**44))")
    return ADDR_TAG | node << _NODE_SHIFT | card << _CARD_SHIFT | offset


def decode_addr(ptr) -> tuple[int, int] | None:
    """``(node, card)`` of a device address, or None if ``ptr`` is not one."""
    ptr = _as_int(ptr)
    if ptr is None or ptr >> 60 != 1:
        return None
    return (ptr >> _NODE_SHIFT) & (_ID_LIMIT - 1), (ptr >> _CARD_SHIFT) & (_ID_LIMIT - 1)


def _as_int(x) -> int | None:
    """``x`` as an int if it is an integer (not bool), else None."""
    if type(x) is int:
        return x
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        return int(x)
    return None


def _round_up(n: int, granule: int) -> int:
    return -(-n // granule) * granule


_STATS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
          "active_bytes", "inactive_split_bytes", "requested_bytes")
_POOLS = ("all", "large_pool", "small_pool")
_COUNTERS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
             "num_sync_all_streams")


class MemoryStats:
    """torch ``memory_stats`` bookkeeping: each stat per pool has current, peak, allocated, freed.

    ``allocated`` and ``freed`` are the cumulative increases and decreases of ``current``.
    Blocks are counted at their physical (512-rounded) size; ``requested_bytes`` counts the
    sizes callers asked for. A block freed while stream work may still use it stays *active*
    until it is reused-safe, as with torch's ``record_stream``.
    """

    def __init__(self):
        self._values = {(stat, pool): [0, 0, 0, 0] for stat in _STATS for pool in _POOLS}
        self.counters = dict.fromkeys(_COUNTERS, 0)

    def add(self, stat: str, pool: str, delta: int) -> None:
        if not delta:
            return
        for key in ((stat, pool), (stat, "all")):
            value = self._values[key]
            value[0] += delta
            if delta > 0:
                value[2] += delta
                if value[0] > value[1]:
                    value[1] = value[0]
            else:
                value[3] -= delta

    def current(self, stat: str, pool: str = "all") -> int:
        return self._values[(stat, pool)][0]

    def on_malloc(self, pool: str, block_bytes: int, requested: int) -> None:
        for stat, delta in (("allocation", 1), ("allocated_bytes", block_bytes),
                            ("requested_bytes", requested), ("active", 1),
                            ("active_bytes", block_bytes)):
            self.add(stat, pool, delta)

    def on_free(self, pool: str, block_bytes: int, requested: int) -> None:
        for stat, delta in (("allocation", -1), ("allocated_bytes", -block_bytes),
                            ("requested_bytes", -requested)):
            self.add(stat, pool, delta)

    def on_inactive(self, pool: str, block_bytes: int) -> None:
        self.add("active", pool, -1)
        self.add("active_bytes", pool, -block_bytes)

    def on_segment(self, pool: str, size: int) -> None:
        """A segment of ``size`` bytes was created (size > 0) or released (size < 0)."""
        self.add("segment", pool, 1 if size > 0 else -1)
        self.add("reserved_bytes", pool, size)
        self.counters["num_device_alloc" if size > 0 else "num_device_free"] += 1

    def on_split_change(self, pool: str, before: tuple[int, int], after: tuple[int, int]) -> None:
        """Apply the net change of free split blocks (count, bytes) caused by one operation."""
        self.add("inactive_split", pool, after[0] - before[0])
        self.add("inactive_split_bytes", pool, after[1] - before[1])

    def as_dict(self) -> dict:
        out = {}
        for (stat, pool), (current, peak, allocated, freed) in self._values.items():
            prefix = f"{stat}.{pool}."
            out[prefix + "current"] = current
            out[prefix + "peak"] = peak
            out[prefix + "allocated"] = allocated
            out[prefix + "freed"] = freed
        out.update(self.counters)
        out["max_split_size"] = -1  # torch reports -1 for "unlimited"
        return out


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


class _Block:
    """A physical block of a segment; blocks of one segment form a doubly linked list."""

    __slots__ = ("segment", "pool", "offset", "size", "free", "prev", "next")

    def __init__(self, segment, pool, offset, size, prev=None, next=None):
        self.segment = segment
        self.pool = pool
        self.offset = offset
        self.size = size
        self.free = True
        self.prev = prev
        self.next = next

    def split_contribution(self) -> tuple[int, int]:
        """(count, bytes) this block adds to the ``inactive_split`` stats."""
        if self.free and (self.prev is not None or self.next is not None):
            return 1, self.size
        return 0, 0


class _FreeList:
    """Free blocks of one pool ordered by (size, segment, offset), for best fit by bisection."""

    def __init__(self):
        self._keys: list[tuple[int, int, int]] = []
        self._blocks: list[_Block] = []

    def add(self, block: _Block) -> None:
        key = (block.size, block.segment.id, block.offset)
        i = bisect_left(self._keys, key)
        self._keys.insert(i, key)
        self._blocks.insert(i, block)

    def remove(self, block: _Block) -> None:
        i = bisect_left(self._keys, (block.size, block.segment.id, block.offset))
        assert self._blocks[i] is block, "free list out of sync with block sizes"
        del self._keys[i], self._blocks[i]

    def best_fit(self, size: int) -> _Block | None:
        i = bisect_left(self._keys, (size,))
        return self._blocks[i] if i < len(self._blocks) else None


class DeviceMemory:
    """The device memory of one card: caching allocator + memory checker, thread-safe.

    ``busy`` callables passed to :meth:`free` and :meth:`free_owner` are called with the memory
    lock held: they must be quick, must not block and must not call back into this object.
    """

    def __init__(self, *, node: int, card: int, capacity: int,
                 small_segment: int = 2 << 20, large_segment: int = 20 << 20,
                 prefault: bool = True, freed_history: int = 100_000,
                 va_size: int = _OFFSET_LIMIT):
        make_addr(node, card, 0)  # validates node and card
        for name, value in (("capacity", capacity), ("small_segment", small_segment),
                            ("large_segment", large_segment)):
            if _as_int(value) is None or value <= 0 or value % MIN_BLOCK:
                raise AclError(_INVALID_PARAM, f"DeviceMemory: {name} {value!r} is invalid "
                                               f"(expected a positive multiple of {MIN_BLOCK})")
        if not VA_BASE < va_size <= _OFFSET_LIMIT or freed_history < 0:
            raise AclError(_INVALID_PARAM, f"DeviceMemory: va_size {va_size} or freed_history "
                                           f"{freed_history} out of range")
        self.node, self.card, self.capacity = node, card, int(capacity)
        self._small_segment, self._large_segment = int(small_segment), int(large_segment)
        self._prefault = prefault
        self._base = make_addr(node, card, 0)
        self._prefix = self._base >> _CARD_SHIFT
        self._lock = threading.Lock()
        self._closed = False
        self._stats = MemoryStats()
        # physical side
        self._segments: dict[int, Segment] = {}
        self._heads: dict[int, _Block] = {}   # segment id -> its block at offset 0
        self._free = {"small_pool": _FreeList(), "large_pool": _FreeList()}
        self._pending: list[tuple[_Block, object]] = []  # freed, but stream work may touch them
        # virtual side: live allocations sorted by start, and a bounded record of freed ones
        self._va_cursor = self._base + VA_BASE
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
        nbytes = _as_int(size)
        if nbytes is None or nbytes <= 0:
            raise AclError(_INVALID_PARAM, f"malloc: size {size!r} is invalid "
                                           f"(expected a positive int number of bytes)")
        policy = _check_policy(policy)
        rounded = ((nbytes - 1) // 32 + 1) * 32 + 32
        with self._lock:
            if self._closed:
                raise AclError(_ALLOC_FAIL, f"malloc: memory of card {self.card} "
                                            f"(node {self.node}) is closed")
            block = self._alloc_block(nbytes, rounded)
            try:
                start = self._place_va(rounded)
            except AclError:
                self._release_block(block)
                raise
            alloc = Allocation(start, nbytes, rounded, owner, policy, block)
            i = bisect_left(self._starts, start)
            self._starts.insert(i, start)
            self._allocs.insert(i, alloc)
            if owner is not None:
                self._by_owner.setdefault(owner, {})[start] = alloc
            self._stats.on_malloc(block.pool, block.size, nbytes)
            return start

    def _alloc_block(self, nbytes: int, rounded: int) -> _Block:
        self._poll_pending()
        block_size = _round_up(rounded, MIN_BLOCK)
        pool = "small_pool" if block_size <= SMALL_SIZE else "large_pool"
        block = self._free[pool].best_fit(block_size) or self._new_segment(block_size, pool)
        if block is None:
            # Like torch: give back every cached segment, then try once more.
            self._stats.counters["num_alloc_retries"] += 1
            self._release_cached()
            block = self._free[pool].best_fit(block_size) or self._new_segment(block_size, pool)
        if block is None:
            self._stats.counters["num_ooms"] += 1
            allocated = self._stats.current("allocated_bytes")
            reserved = self._stats.current("reserved_bytes")
            raise AclError(_ALLOC_FAIL,
                           f"malloc: out of memory on card {self.card} (node {self.node}): "
                           f"requested {nbytes} bytes (rounded {rounded}); allocated {allocated}, "
                           f"reserved {reserved} (cached {reserved - allocated}), "
                           f"capacity {self.capacity}")
        self._take(block, block_size)
        return block

    def _segment_sizes(self, block_size: int, pool: str) -> list[int]:
        """Segment sizes to try for a miss: the torch size first, then tighter ones.

        The tighter fallbacks let a card whose capacity is smaller than a standard segment
        (tests use a few MiB) still be filled.
        """
        if pool == "small_pool":
            natural = self._small_segment
        elif block_size < MIN_LARGE_ALLOC:
            natural = self._large_segment
        else:
            natural = _round_up(block_size, ROUND_LARGE)
        sizes = []
        for size in (natural, _round_up(block_size, ROUND_LARGE), block_size):
            if size >= block_size and (not sizes or size < sizes[-1]):
                sizes.append(size)
        return sizes

    def _new_segment(self, block_size: int, pool: str) -> _Block | None:
        reserved = self._stats.current("reserved_bytes")
        for size in self._segment_sizes(block_size, pool):
            if reserved + size <= self.capacity:
                seg = Segment(size, name=f"npusim-n{self.node}c{self.card}", prefault=self._prefault)
                head = _Block(seg, pool, 0, size)
                self._segments[seg.id] = seg
                self._heads[seg.id] = head
                self._free[pool].add(head)
                self._stats.on_segment(pool, size)
                return head
        return None

    def _take(self, block: _Block, block_size: int) -> None:
        """Mark a free block used, splitting off the remainder when it is worth keeping."""
        free_list = self._free[block.pool]
        free_list.remove(block)
        before = block.split_contribution()
        remaining = block.size - block_size
        # torch's rule: small blocks split down to 512 B, large ones only above 1 MiB of rest
        if block.pool == "small_pool":
            split = remaining >= MIN_BLOCK
        else:
            split = remaining > SMALL_SIZE
        if split:
            rest = _Block(block.segment, block.pool, block.offset + block_size, remaining,
                          prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = block_size
            free_list.add(rest)
            after = rest.split_contribution()
        else:
            after = (0, 0)
        block.free = False
        self._stats.on_split_change(block.pool, before, after)

    def _retire(self, block: _Block) -> None:
        """A freed block is safe to reuse: it stops being active and goes back to its pool."""
        self._stats.on_inactive(block.pool, block.size)
        self._release_block(block)

    def _release_block(self, block: _Block) -> None:
        """Return a used block to its pool, merging with free neighbours."""
        free_list = self._free[block.pool]
        before = [0, 0]  # split contributions of the free neighbours about to be merged
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                count, nbytes = neighbour.split_contribution()
                before[0] += count
                before[1] += nbytes
        block.free = True
        prev, nxt = block.prev, block.next
        if prev is not None and prev.free:
            free_list.remove(prev)
            prev.size += block.size
            prev.next = nxt
            if nxt is not None:
                nxt.prev = prev
            block = prev
        if nxt is not None and nxt.free:
            free_list.remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
        free_list.add(block)
        self._stats.on_split_change(block.pool, before, block.split_contribution())

    # ---- virtual addresses -----------------------------------------------------------------

    def _place_va(self, rounded: int) -> int:
        """A fresh virtual range for ``rounded`` bytes plus the guard gap, past every live one."""
        need = rounded + VA_GUARD
        start, wrapped_now = self._va_cursor, False
        while True:
            if start + need > self._va_end:
                if wrapped_now:
                    raise AclError(_ALLOC_FAIL, f"malloc: virtual address space of card {self.card} "
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
        self._va_cursor = _round_up(start + need, VA_ALIGN)
        if self._wrapped:
            self._forget_freed(start, self._va_cursor)
        return start

    @staticmethod
    def _va_stop(alloc: Allocation) -> int:
        return _round_up(alloc.start + alloc.rounded + VA_GUARD, VA_ALIGN)

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
            p = _as_int(ptr)
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
        if busy is not None and _still_busy(busy):
            self._pending.append((block, busy))
        else:
            self._retire(block)

    def free_owner(self, owner, *, busy=None) -> int:
        """Free every allocation of ``owner``, then release fully free segments; returns the count."""
        with self._lock:
            starts = list(self._by_owner.get(owner, ()))
            for start in starts:
                self._free_alloc(bisect_left(self._starts, start), busy)
            self._release_free_segments()
            return len(starts)

    def _poll_pending(self) -> None:
        if self._pending:
            still = []
            for block, busy in self._pending:
                if _still_busy(busy):
                    still.append((block, busy))
                else:
                    self._retire(block)
            self._pending = still

    def _release_free_segments(self) -> None:
        for seg_id, head in list(self._heads.items()):
            if head.free and head.next is None:
                self._free[head.pool].remove(head)
                del self._heads[seg_id]
                seg = self._segments.pop(seg_id)
                self._stats.on_segment(head.pool, -seg.size)
                seg.close()

    def _release_cached(self) -> None:
        self._stats.counters["num_sync_all_streams"] += 1
        self._poll_pending()
        self._release_free_segments()

    def empty_cache(self) -> None:
        """Release cached segments that hold no live (or still busy) block."""
        with self._lock:
            self._release_cached()

    # ---- checked access --------------------------------------------------------------------

    def _find(self, ptr, nbytes, what: str) -> Allocation:
        """The live allocation holding ``[ptr, ptr + nbytes)``, or raise 107000 saying why not."""
        if type(ptr) is not int or type(nbytes) is not int:  # numpy integers are fine too
            p, n = _as_int(ptr), _as_int(nbytes)
            if p is None or n is None:
                raise AclError(_RT_PARAM, self._access_miss(ptr, nbytes, what))
            ptr, nbytes = p, n
        if ptr >> _CARD_SHIFT == self._prefix and nbytes >= 0:
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
            dims = (shape,) if _as_int(shape) is not None else tuple(shape)
        except TypeError:
            dims = (None,)
        if any(_as_int(d) is None or d < 0 for d in dims):
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
            seg = self._segments.get(seg_id)
        if seg is None:
            raise AclError(_RT_PARAM, f"segment: card {self.card} (node {self.node}) has no "
                                      f"segment {seg_id!r} (live: {sorted(self._segments)})")
        return seg

    # ---- error messages (slow path) ----------------------------------------------------------

    def _containing(self, starts: list[int], allocs: list[Allocation], p: int):
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
            shown = repr(ptr) if _as_int(ptr) is None else f"0x{int(ptr):x}"
            return f"{shown} is not a device address (expected a pointer returned by malloc on {mine})"
        if where != (self.node, self.card):
            return f"0x{int(ptr):x} belongs to card {where[1]} of node {where[0]}, not to {mine}"
        return None

    def _access_miss(self, ptr, nbytes, what: str) -> str:
        if _as_int(nbytes) is None or nbytes < 0:
            at = f"0x{int(ptr):x}" if _as_int(ptr) is not None else repr(ptr)
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

    # ---- reporting and teardown -------------------------------------------------------------

    def mem_info(self) -> tuple[int, int]:
        """``(free, total)`` as aclrtGetMemInfo: free is capacity minus reserved."""
        with self._lock:
            return self.capacity - self._stats.current("reserved_bytes"), self.capacity

    def stats(self) -> dict:
        """Counters in the key style of torch.cuda.memory_stats()."""
        with self._lock:
            return self._stats.as_dict()

    def close(self) -> None:
        """Release every segment; every pointer of this card becomes invalid. Idempotent."""
        with self._lock:
            self._closed = True
            # Free through the normal path so stats and the freed record stay truthful:
            # a pointer used after reset_device is reported as a use after free.
            while self._allocs:
                self._free_alloc(len(self._allocs) - 1, None)
            for block, _ in self._pending:
                self._retire(block)
            self._pending.clear()
            self._release_free_segments()
            assert not self._segments, "a segment still holds a block after every free"


_POLICIES = frozenset(int(m) for m in MemMallocPolicy)


def _check_policy(policy) -> int:
    p = _as_int(policy)
    if p is None or p < 0 or (p & ~MALLOC_POLICY_FLAGS) not in _POLICIES:
        valid = ", ".join(f"{m.name}={m.value}" for m in MemMallocPolicy)
        raise AclError(_INVALID_PARAM,
                       f"malloc: policy {policy!r} is invalid (expected one of {valid}, optionally "
                       f"OR-ed with the flags 0x{MALLOC_POLICY_FLAGS:x})")
    return p


def _still_busy(busy) -> bool:
    try:
        return bool(busy())
    except Exception:
        # A stream whose work failed runs nothing more, so nothing can touch the block.
        return False
