"""The card memory ``npu`` tensors are accounted to: segments this process reserves on card k, as torch_npu's
caching allocator reserves them from the driver, and the blocks of live tensors packed into them.

torch_npu never asks the device for one tensor's bytes: it reserves a *segment* (``get_allocation_size``:
2 MiB for a block of at most 1 MiB, the small pool; 20 MiB for a block under 10 MiB; above that the block rounded
up to 2 MiB — the large pool) and hands out blocks (sizes rounded up to 512 bytes) from it. Here a block fits a
segment of its pool with that many free bytes (best fit; a block never spans segments, but a segment's free bytes
are not tracked by address, so there is no fragmentation inside it). Only a new segment costs a round trip to the
card — never a tensor.

A segment is a real allocation on the card through the runtime (``rt.malloc`` in the device's default context):
the card counts it in ``rt.get_mem_info``, ``npu-smi`` shows it against this process, and the card refuses it
past its HBM — shared with everything else on the card (acl mallocs, collectives' buffers, other processes).
The card's ``aclrtMalloc`` pads a request by 32 bytes and carves 512-byte blocks from segments of its own, so the
request is sized to make the card hold exactly the segment: a large segment of N bytes is one card malloc of
``N - 512`` bytes (a block of exactly N, which the card puts in a segment of exactly N); a 2 MiB small segment is
two card mallocs of ``1 MiB - 512`` (two 1 MiB blocks filling one of the card's 2 MiB small segments — with the
card's default segment sizes). The tensors' bytes stay host memory of this process (``storage.py``).

Segments live in the device's default context: ``rt.reset_device``, ``rt.finalize`` or the process's exit
releases them on the card (which frees every allocation of a closed connection); a segment whose context is gone
is dropped here the next time its device is looked at.
"""

from __future__ import annotations

import rt
from rt.constants import AclErrorCode
from rt.errors import AclError
from rt.host.runtime import RUNTIME

from . import _runtime

MIN_BLOCK = 512                      # kMinBlockSize: block sizes are multiples of this
SMALL_SIZE = 1 << 20                 # kSmallSize: blocks of at most 1 MiB come from the small pool
SMALL_BUFFER = 2 << 20               # kSmallBuffer: the small pool's segment
LARGE_BUFFER = 20 << 20              # kLargeBuffer: the large pool's segment for blocks under kMinLargeAlloc
MIN_LARGE_ALLOC = 10 << 20           # kMinLargeAlloc
ROUND_LARGE = 2 << 20                # kRoundLarge: bigger blocks get a segment of their size rounded to this
CARD_PAD = 512                       # a card malloc of n bytes holds a block of n + 512 (32 of padding, rounded)


def round_size(nbytes: int) -> int:
    """torch's ``round_size``: the block a request of ``nbytes`` takes."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def pool_of(block: int) -> str:
    return "small_pool" if block <= SMALL_SIZE else "large_pool"


def allocation_size(block: int) -> int:
    """torch's ``get_allocation_size``: the segment reserved for a block that fits no existing one."""
    if block <= SMALL_SIZE:
        return SMALL_BUFFER
    if block < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-block // ROUND_LARGE) * ROUND_LARGE


class Segment:
    """One reservation on card ``device``: ``size`` bytes of ``pool``, ``used`` by live blocks."""

    __slots__ = ("ctx", "device", "pool", "ptrs", "size", "used")

    def __init__(self, ctx, device: int, pool: str, size: int, ptrs: list[int]):
        self.ctx, self.device, self.pool, self.size, self.ptrs = ctx, device, pool, size, ptrs
        self.used = 0

    @property
    def alive(self) -> bool:
        return not self.ctx.destroyed

    @property
    def free(self) -> int:
        return self.size - self.used


# Bytes a process may reserve per card (torch.npu.set_per_process_memory_fraction); no entry: the card's all.
ALLOWED: dict[int, int] = {}


class CardRefused(Exception):
    """The card refused a segment (out of memory), or the process's cap did (``allowed``, ``ALLOWED``); carries the
    card's ``(free, total)`` at that moment."""

    def __init__(self, size: int, free: int, total: int, allowed: int | None = None):
        super().__init__(size, free, total, allowed)
        self.size, self.free, self.total, self.allowed = size, free, total, allowed


def card_ready() -> bool:
    """Whether allocations reserve on the cards (the runtime runs); otherwise ``storage.py`` only counts them."""
    return rt.is_initialized()


class Reservations:
    """This process's segments on one card, per pool, and the most recently used one of each pool."""

    def __init__(self, device: int):
        self.device = device
        self.pools: dict[str, list[Segment]] = {"small_pool": [], "large_pool": []}
        self.last: dict[str, Segment | None] = {"small_pool": None, "large_pool": None}

    def segments(self):
        for segs in self.pools.values():
            yield from segs

    def dead(self) -> list[Segment]:
        """Drop the segments whose context is gone (the card already released them); returns them."""
        gone = [s for s in self.segments() if not s.alive]
        for s in gone:
            self.pools[s.pool].remove(s)
            if self.last[s.pool] is s:
                self.last[s.pool] = None
        return gone

    def find(self, block: int) -> Segment | None:
        """A live segment of the block's pool with ``block`` free bytes: the last one used, else the best fit."""
        pool = pool_of(block)
        seg = self.last[pool]
        if seg is not None and seg.free >= block and seg.alive:
            return seg
        best = None
        for s in self.pools[pool]:
            if s.free >= block and s.alive and (best is None or s.free < best.free):
                best = s
        if best is not None:
            self.last[pool] = best
        return best

    def reserve(self, block: int) -> Segment:
        """A new segment for ``block`` on the card; :class:`CardRefused` when the card is out of memory."""
        pool, size = pool_of(block), allocation_size(block)
        allowed = ALLOWED.get(self.device)
        if allowed is not None and sum(seg.size for seg in self.segments() if seg.alive) + size > allowed:
            free, total = card_mem_info(self.device)
            raise CardRefused(size, free, total, allowed)
        ctx = _runtime.context(self.device)
        parts = [SMALL_SIZE - CARD_PAD] * (size // SMALL_SIZE) if pool == "small_pool" else [size - CARD_PAD]
        ptrs: list[int] = []
        with RUNTIME.using(ctx):
            try:
                for n in parts:
                    ptrs.append(rt.malloc(n))
            except AclError as e:
                for p in ptrs:
                    rt.free(p)
                if e.code != AclErrorCode.ACL_ERROR_RT_MEMORY_ALLOCATION:
                    raise
                free, total = rt.get_mem_info()
                raise CardRefused(size, int(free), int(total)) from None
        seg = Segment(ctx, self.device, pool, size, ptrs)
        self.pools[pool].append(seg)
        self.last[pool] = seg
        return seg

    def release_unused(self) -> list[Segment]:
        """Give the segments no live block uses back to the card; returns them."""
        unused = [s for s in self.segments() if s.used == 0 and s.alive]
        for s in unused:
            self.pools[s.pool].remove(s)
            if self.last[s.pool] is s:
                self.last[s.pool] = None
            with RUNTIME.using(s.ctx):
                for p in s.ptrs:
                    rt.free(p)
        return unused


def card_empty_cache(device: int) -> None:
    """Have card ``device`` release its own cached segments (what this process just freed among them)."""
    with _runtime.on(device):
        rt.empty_cache()


def card_mem_info(device: int) -> tuple[int, int]:
    """``(free, total)`` of card ``device`` as the card reports them (``rt.get_mem_info``)."""
    with _runtime.on(device):
        free, total = rt.get_mem_info()
    return int(free), int(total)
