"""The physical side of a card's memory: blocks carved from memfd segments, as PyTorch's caching allocator.

Blocks of at most 1 MiB come from a small pool of ``small_segment``-byte segments, 1-10 MiB from
``large_segment`` segments, bigger requests get their own segment rounded up to 2 MiB; best fit, split,
merge with free neighbours on release, segments cached until ``release_cached`` (``empty_cache``). The sum
of segment sizes never exceeds the card's capacity. Not thread-safe: ``DeviceMemory`` holds its lock.
"""

from __future__ import annotations

from bisect import bisect_left

from ..constants import AclErrorCode
from ..errors import EL0004, AclError, oom_message
from ..wire.segment import Segment
from .memstats import MemoryStats

MIN_BLOCK = 512             # kMinBlockSize: physical blocks are multiples of this
SMALL_SIZE = 1 << 20        # kSmallSize: blocks up to this come from the small pool
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: below this, carve from a large_segment
ROUND_LARGE = 2 << 20       # kRoundLarge: bigger requests get their own segment of this granule


def round_up(n: int, granule: int) -> int:
    return -(-n // granule) * granule


class Block:
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


class FreeList:
    """Free blocks of one pool ordered by (size, segment, offset), for best fit by bisection."""

    def __init__(self):
        self._keys: list[tuple[int, int, int]] = []
        self._blocks: list[Block] = []

    def add(self, block: Block) -> None:
        key = (block.size, block.segment.id, block.offset)
        i = bisect_left(self._keys, key)
        self._keys.insert(i, key)
        self._blocks.insert(i, block)

    def remove(self, block: Block) -> None:
        i = bisect_left(self._keys, (block.size, block.segment.id, block.offset))
        assert self._blocks[i] is block, "free list out of sync with block sizes"
        del self._keys[i], self._blocks[i]

    def best_fit(self, size: int) -> Block | None:
        i = bisect_left(self._keys, (size,))
        return self._blocks[i] if i < len(self._blocks) else None


class BlockPool:
    """Segments of one card and the blocks carved from them; ``stats`` is the card's MemoryStats."""

    def __init__(self, *, node: int, card: int, capacity: int, small_segment: int, large_segment: int,
                 prefault: bool, stats: MemoryStats):
        self.node, self.card, self.capacity = node, card, capacity
        self._small_segment, self._large_segment = small_segment, large_segment
        self._prefault = prefault
        self._stats = stats
        self.segments: dict[int, Segment] = {}
        self._heads: dict[int, Block] = {}   # segment id -> its block at offset 0
        self._free = {"small_pool": FreeList(), "large_pool": FreeList()}
        self._pending: list[tuple[Block, object]] = []  # freed, but stream work may touch them

    def alloc(self, nbytes: int, rounded: int) -> Block:
        """A used block for ``rounded`` bytes; 207001 naming the numbers when the card is full."""
        self.poll_pending()
        block_size = round_up(rounded, MIN_BLOCK)
        pool = "small_pool" if block_size <= SMALL_SIZE else "large_pool"
        block = self._free[pool].best_fit(block_size) or self._new_segment(block_size, pool)
        if block is None:
            # Like torch: give back every cached segment, then try once more.
            self._stats.counters["num_alloc_retries"] += 1
            self.release_cached()
            block = self._free[pool].best_fit(block_size) or self._new_segment(block_size, pool)
        if block is None:
            self._stats.counters["num_ooms"] += 1
            allocated = self._stats.current("allocated_bytes")
            reserved = self._stats.current("reserved_bytes")
            raise AclError(AclErrorCode.ACL_ERROR_RT_MEMORY_ALLOCATION,
                           oom_message(self.card, self.node, nbytes, rounded, allocated, reserved, self.capacity))
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
            natural = round_up(block_size, ROUND_LARGE)
        sizes = []
        for size in (natural, round_up(block_size, ROUND_LARGE), block_size):
            if size >= block_size and (not sizes or size < sizes[-1]):
                sizes.append(size)
        return sizes

    def _new_segment(self, block_size: int, pool: str) -> Block | None:
        reserved = self._stats.current("reserved_bytes")
        for size in self._segment_sizes(block_size, pool):
            if reserved + size <= self.capacity:
                try:
                    seg = Segment(size, name=f"npusim-n{self.node}c{self.card}", prefault=self._prefault)
                except AclError as e:      # the host cannot back it: still a failed device allocation
                    if e.code != AclErrorCode.ACL_ERROR_RT_MEMORY_ALLOCATION or e.message.startswith(EL0004):
                        raise
                    raise AclError(e.code, f"{EL0004} malloc on card {self.card} (node {self.node}): "
                                           f"{e.message}") from None
                head = Block(seg, pool, 0, size)
                self.segments[seg.id] = seg
                self._heads[seg.id] = head
                self._free[pool].add(head)
                self._stats.on_segment(pool, size)
                return head
        return None

    def _take(self, block: Block, block_size: int) -> None:
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
            rest = Block(block.segment, block.pool, block.offset + block_size, remaining,
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

    def retire(self, block: Block) -> None:
        """A freed block is safe to reuse: it stops being active and goes back to its pool."""
        self._stats.on_inactive(block.pool, block.size)
        self.release(block)

    def release(self, block: Block) -> None:
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

    def defer(self, block: Block, busy) -> None:
        """A freed block that queued stream work may still touch: reused once ``busy()`` is False."""
        self._pending.append((block, busy))

    def poll_pending(self) -> None:
        if self._pending:
            still = []
            for block, busy in self._pending:
                if still_busy(busy):
                    still.append((block, busy))
                else:
                    self.retire(block)
            self._pending = still

    def release_free_segments(self) -> None:
        for seg_id, head in list(self._heads.items()):
            if head.free and head.next is None:
                self._free[head.pool].remove(head)
                del self._heads[seg_id]
                seg = self.segments.pop(seg_id)
                self._stats.on_segment(head.pool, -seg.size)
                seg.close()

    def release_cached(self) -> None:
        self._stats.counters["num_sync_all_streams"] += 1
        self.poll_pending()
        self.release_free_segments()

    def close(self) -> None:
        """Retire what was pending and release every segment (after every allocation was freed)."""
        for block, _ in self._pending:
            self.retire(block)
        self._pending.clear()
        self.release_free_segments()
        assert not self.segments, "a segment still holds a block after every free"


def still_busy(busy) -> bool:
    try:
        return bool(busy())
    except Exception:
        # A stream whose work failed runs nothing more, so nothing can touch the block.
        return False
