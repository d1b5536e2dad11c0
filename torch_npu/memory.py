"""``torch.npu`` memory statistics and ``mem_get_info``: the blocks of ``npu:k`` tensors and the segments this
process reserved for them on card k (``storage.py``, ``segments.py``).

torch_npu's names, arguments and return shapes (``memory_stats`` is an ``OrderedDict`` in torch's
``"allocated_bytes.all.current"`` key style, ``memory_summary`` a text table). ``memory_allocated`` is the bytes of
live npu tensors, ``memory_reserved`` the segments the card holds for this process (while the runtime runs; before,
each tensor is only counted and reserved equals allocated), ``empty_cache`` gives the unused segments back to the
card, ``mem_get_info`` is the card's own answer.
"""

from __future__ import annotations

import collections

import torch

from . import segments, storage
from ._error_code import ErrCode, pta_error
from .backend import current_index
from .distributed.bootstrap import device_count

__all__ = ["empty_cache", "max_memory_allocated", "max_memory_reserved", "mem_get_info", "memory_allocated",
           "memory_reserved", "memory_stats", "memory_stats_as_nested_dict", "memory_summary",
           "reset_accumulated_memory_stats", "reset_max_memory_allocated", "reset_peak_memory_stats"]


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
    index = _device_index(device)
    with storage._lock:
        storage.sweep()
        storage.reservations(index)            # segments the card already released are dropped
        return storage.stats(index)


def memory_stats_as_nested_dict(device=None) -> dict:
    """The statistics of :func:`memory_stats` as nested dicts (``stats["allocated_bytes"]["all"]["current"]``)."""
    st = _current(device)
    out: dict = {}
    for name, table in (("allocated_bytes", st.nbytes), ("reserved_bytes", st.reserved), ("active_bytes", st.nbytes),
                        ("requested_bytes", st.nbytes), ("allocation", st.count), ("segment", st.segments),
                        ("active", st.count)):
        out[name] = {pool: {"current": s.current, "peak": s.peak, "allocated": s.allocated, "freed": s.freed}
                     for pool, s in table.items()}
    zero = {pool: {"current": 0, "peak": 0, "allocated": 0, "freed": 0} for pool in storage.POOLS}
    out["inactive_split"] = zero
    out["inactive_split_bytes"] = {p: dict(v) for p, v in zero.items()}
    out.update(num_alloc_retries=st.num_alloc_retries, num_ooms=st.num_ooms, num_sync_all_streams=0,
               num_device_alloc=st.segments["all"].allocated, num_device_free=st.segments["all"].freed,
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
    """Bytes this process holds on the card for npu tensors: its segments there (``rt.get_mem_info`` counts them);
    before the runtime runs, the counted tensors' bytes."""
    return _current(device).reserved["all"].current


def max_memory_reserved(device=None) -> int:
    """Peak of :func:`memory_reserved` since the start or the last :func:`reset_peak_memory_stats`."""
    return _current(device).reserved["all"].peak


def reset_peak_memory_stats(device=None) -> None:
    """Peaks restart from the current values."""
    _current(device).reset_peak()


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    """The ``allocated``/``freed`` totals, ``num_ooms`` and ``num_alloc_retries`` restart from zero."""
    st = _current(device)
    for table in (st.nbytes, st.count, st.reserved, st.segments):
        for s in table.values():
            s.allocated = s.freed = 0
    st.num_ooms = st.num_alloc_retries = 0


def empty_cache() -> None:
    """Give every segment no live npu tensor uses back to its card (which releases them at once)."""
    storage.sweep()
    ready = segments.card_ready()
    for index in storage.devices():
        if storage.release_unused(index) and ready:
            segments.card_empty_cache(index)


def mem_get_info(device=None) -> tuple[int, int]:
    """``(free, total)`` bytes of the card's HBM as the card reports them (``rt.get_mem_info``: everything on the
    card counts, this process's segments among them). Before the runtime runs: the config's capacity less the
    bytes counted here."""
    index = _device_index(device)
    if not 0 <= index < device_count():
        raise AssertionError("Invalid device id" + pta_error(ErrCode.VALUE))
    if segments.card_ready():
        return segments.card_mem_info(index)
    cap = storage.capacity(index)
    return max(cap - memory_reserved(index), 0), cap


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
            "|{:^36}|{:^38}|".format(f"NPU OOMs: {st.num_ooms}", f"npuMalloc retries: {st.num_alloc_retries}"), line,
            "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |", "|" + "-" * 75 + "|"]
    pools = ("all",) if abbreviated else storage.POOLS
    for title, table, fmt in (("Allocated memory", st.nbytes, _fmt), ("Active memory", st.nbytes, _fmt),
                              ("Requested memory", st.nbytes, _fmt), ("GPU reserved memory", st.reserved, _fmt),
                              ("Allocations", st.count, str), ("Active allocs", st.count, str),
                              ("GPU reserved segments", st.segments, str)):
        title = title.replace("GPU", "NPU")
        for pool in pools:
            s = table[pool]
            label = title if pool == "all" else f"      from {pool.replace('_pool', '')} pool"
            rows.append(f"| {label:<21} | {fmt(s.current):>10} | {fmt(s.peak):>10} | {fmt(s.allocated):>10} | "
                        f"{fmt(s.freed):>10} |")
        rows.append("|" + "-" * 75 + "|")
    rows.append("|{:<75}|".format(" npusim: segments reserved on the card; the tensors' bytes are host memory"))
    rows.append(line)
    return "\n".join(rows) + "\n"
