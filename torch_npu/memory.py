"""``torch.npu`` memory statistics: the bytes of ``npu:k`` tensors, counted on card k (``storage.py``).

torch_npu's names, arguments and return shapes (``memory_stats`` is an ``OrderedDict`` in torch's
``"allocated_bytes.all.current"`` key style, ``memory_summary`` a text table). npusim's npu tensors are not cached
after they die, so reserved memory equals allocated memory and ``empty_cache`` only settles the counters.
"""

from __future__ import annotations

import collections

import torch

from . import storage
from .backend import current_index

__all__ = ["empty_cache", "max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved",
           "memory_stats", "memory_stats_as_nested_dict", "memory_summary", "reset_accumulated_memory_stats",
           "reset_max_memory_allocated", "reset_peak_memory_stats"]


def _device_index(device) -> int:
    """torch_npu's ``_get_device_index``: None (the current device), an int, ``"npu:N"`` or torch.device."""
    if device is None:
        return current_index()
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    if isinstance(device, (str, torch.device)):
        dev = torch.device(device)
        if dev.type != "npu":
            raise ValueError(f"Expected a npu device, but got: {dev}")
        return current_index() if dev.index is None else dev.index
    raise ValueError(f"Expected a npu device, but got: {device!r}")


def _current(device) -> storage.DeviceStats:
    storage.sweep()
    return storage.stats(_device_index(device))


def memory_stats_as_nested_dict(device=None) -> dict:
    """The statistics of :func:`memory_stats` as nested dicts (``stats["allocated_bytes"]["all"]["current"]``)."""
    st = _current(device)
    out: dict = {}
    for name, table in (("allocated_bytes", st.nbytes), ("reserved_bytes", st.nbytes), ("active_bytes", st.nbytes),
                        ("requested_bytes", st.nbytes), ("allocation", st.count), ("segment", st.count),
                        ("active", st.count)):
        out[name] = {pool: {"current": s.current, "peak": s.peak, "allocated": s.allocated, "freed": s.freed}
                     for pool, s in table.items()}
    zero = {pool: {"current": 0, "peak": 0, "allocated": 0, "freed": 0} for pool in storage.POOLS}
    out["inactive_split"] = zero
    out["inactive_split_bytes"] = {p: dict(v) for p, v in zero.items()}
    out.update(num_alloc_retries=0, num_ooms=st.num_ooms, num_sync_all_streams=0,
               num_device_alloc=st.count["all"].allocated, num_device_free=st.count["all"].freed,
               max_split_size=-1)
    return out


def memory_stats(device=None) -> collections.OrderedDict:
    """torch_npu's flat statistics: ``"allocated_bytes.all.current"``, ``"num_ooms"``, ... sorted by key."""
    flat = []

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat.append((prefix, value))
    walk("", memory_stats_as_nested_dict(device))
    return collections.OrderedDict(sorted(flat))


def memory_allocated(device=None) -> int:
    """Bytes of live npu tensors on the device."""
    return _current(device).nbytes["all"].current


def max_memory_allocated(device=None) -> int:
    """Peak of :func:`memory_allocated` since the start or the last :func:`reset_peak_memory_stats`."""
    return _current(device).nbytes["all"].peak


def memory_reserved(device=None) -> int:
    """Bytes held for npu tensors (no cache here: equal to :func:`memory_allocated`)."""
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated(device)


def reset_peak_memory_stats(device=None) -> None:
    """Peaks restart from the current values."""
    _current(device).reset_peak()


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    """The ``allocated``/``freed`` totals and ``num_ooms`` restart from zero."""
    st = _current(device)
    for s in (*st.nbytes.values(), *st.count.values()):
        s.allocated = s.freed = 0
    st.num_ooms = 0


def empty_cache() -> None:
    """Nothing is cached: settles the counters of npu tensors that died."""
    storage.sweep()


def _fmt(nbytes: int) -> str:
    for unit in ("B ", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:6d} {unit}" if unit == "B " else f"{nbytes:6.0f} {unit}"
        nbytes /= 1024
    return str(nbytes)


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A table of the statistics, in the layout of torch's ``memory_summary``."""
    index = _device_index(device)
    st = _current(index)
    line = "|" + "=" * 75 + "|"
    rows = [line, "|{:^75}|".format(f"PyTorch NPU memory summary, device ID {index}"), "|" + "-" * 75 + "|",
            "|{:^36}|{:^38}|".format(f"NPU OOMs: {st.num_ooms}", "npuMalloc retries: 0"), line,
            "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |", "|" + "-" * 75 + "|"]
    pools = ("all",) if abbreviated else storage.POOLS
    for title, table, fmt in (("Allocated memory", st.nbytes, _fmt), ("Active memory", st.nbytes, _fmt),
                              ("Requested memory", st.nbytes, _fmt), ("GPU reserved memory", st.nbytes, _fmt),
                              ("Allocations", st.count, str), ("Active allocs", st.count, str)):
        title = title.replace("GPU", "NPU")
        for pool in pools:
            s = table[pool]
            label = title if pool == "all" else f"      from {pool.replace('_pool', '')} pool"
            rows.append(f"| {label:<21} | {fmt(s.current):>10} | {fmt(s.peak):>10} | {fmt(s.allocated):>10} | "
                        f"{fmt(s.freed):>10} |")
        rows.append("|" + "-" * 75 + "|")
    rows.append("|{:<75}|".format(" npusim: npu tensors are host memory, counted against the card's HBM"))
    rows.append(line)
    return "\n".join(rows) + "\n"
