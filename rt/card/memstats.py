"""Allocator statistics in the key style of torch's ``memory_stats`` (``allocated_bytes.all.current``, ...)."""

from __future__ import annotations

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
