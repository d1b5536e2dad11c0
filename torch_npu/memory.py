"""``torch.npu`` memory statistics and ``mem_get_info``: the blocks of ``npu:k`` tensors and the segments this
process reserved for them on card k (``storage.py``, ``segments.py``).

torch_npu's names, arguments and return shapes (``memory_stats`` is an ``OrderedDict`` in torch's
``"allocated_bytes.all.current"`` key style, ``memory_summary`` a text table). ``memory_allocated`` is the bytes of
live npu tensors, ``memory_reserved`` the segments the card holds for this process (while the runtime runs; before,
each tensor is only counted and reserved equals allocated), ``empty_cache`` gives the unused segments back to the
card, ``mem_get_info`` is the card's own answer.

``set_per_process_memory_fraction`` caps what the process may reserve on a card, as torch_npu's allocator caps
it: a new segment that would take the process's segments there past ``fraction * total`` is refused; the unused
segments go back to the card and the segment is asked for once more, then ``torch.OutOfMemoryError`` with
torch_npu's text (``... free; 600.00 MiB allowed; ... reserved in total by PyTorch)``). ``caching_allocator_alloc``
takes a block of the caching allocator for other frameworks (an npu tensor's bytes, counted as every tensor's);
``memory_snapshot`` lists the segments and their blocks. There is no caching pinned-host allocator, so
``host_memory_stats`` and its resets say so.
"""

from __future__ import annotations

import collections
import warnings

import torch

from . import segments, storage
from ._error_code import ErrCode, pta_error
from .backend import current_index
from .distributed.bootstrap import device_count

__all__ = ["caching_allocator_alloc", "caching_allocator_delete", "empty_cache", "get_per_process_memory_fraction",
           "host_memory_stats", "host_memory_stats_as_nested_dict", "max_memory_allocated", "max_memory_cached",
           "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_cached", "memory_reserved",
           "memory_snapshot", "memory_stats", "memory_stats_as_nested_dict", "memory_summary",
           "reset_accumulated_host_memory_stats", "reset_accumulated_memory_stats", "reset_max_memory_allocated",
           "reset_max_memory_cached", "reset_peak_host_memory_stats", "reset_peak_memory_stats",
           "set_per_process_memory_fraction"]


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


# ------------------------------------------------------------------ the names torch_npu keeps from torch.cuda
def memory_cached(device=None) -> int:
    """Deprecated name of :func:`memory_reserved`."""
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    """Deprecated name of :func:`max_memory_reserved`."""
    return max_memory_reserved(device)


def reset_max_memory_cached(device=None) -> None:
    """Resets every peak (with torch_npu's deprecation warning)."""
    warnings.warn("torch_npu.npu.reset_max_memory_cached now calls torch_npu.npu.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", DeprecationWarning)
    reset_peak_memory_stats(device)


# ------------------------------------------------------------------ per-process memory fraction


def _checked_index(device) -> int:
    index = current_index() if device is None else _device_index(device)
    if not 0 <= index < device_count():
        raise AssertionError("Invalid device id" + pta_error(ErrCode.VALUE))
    return index


def set_per_process_memory_fraction(fraction, device=None) -> None:
    """Cap this process's segments on the card at ``fraction * total`` bytes (1.0 lifts the cap). Starts the
    runtime (the card tells its capacity), as torch_npu initializes the device."""
    from . import _runtime
    _runtime.lazy_init()
    index = _checked_index(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`" + pta_error(ErrCode.TYPE))
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1" + pta_error(ErrCode.VALUE))
    segments.ALLOWED.pop(index, None)
    if fraction < 1.0:
        segments.ALLOWED[index] = int(fraction * segments.card_mem_info(index)[1])


def get_per_process_memory_fraction(device=None) -> float:
    """The fraction set by :func:`set_per_process_memory_fraction` (1.0 when none is)."""
    from . import _runtime
    _runtime.lazy_init()
    index = _checked_index(device)
    allowed = segments.ALLOWED.get(index)
    return 1.0 if allowed is None else allowed / segments.card_mem_info(index)[1]


# ------------------------------------------------------------------ raw blocks for other frameworks
_raw: dict[int, torch.Tensor] = {}   # data pointer -> the npu tensor whose bytes it is


def caching_allocator_alloc(size, device=None, stream=None) -> int:
    """``size`` bytes from the caching allocator on ``device`` (counted in ``memory_allocated`` like a tensor's);
    returns the address, to give back with :func:`caching_allocator_delete`. ``stream`` is checked as torch_npu
    checks it (a ``torch.npu.Stream`` or an int)."""
    from .streams import Stream, current_stream
    index = _checked_index(device)
    if stream is None:
        stream = current_stream(index)
    if isinstance(stream, Stream):
        stream = stream.npu_stream
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TypeError("Invalid type for stream argument, must be `torch_npu.npu.Stream` or `int` representing a "
                        "pointer to a existing stream" + pta_error(ErrCode.TYPE))
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise TypeError(f"caching_allocator_alloc: size must be a non-negative int, got {size!r}"
                        + pta_error(ErrCode.TYPE))
    if size == 0:
        return 0                     # torch_npu's raw_alloc of 0 bytes is the null pointer
    block = torch.empty(size, dtype=torch.uint8, device=torch.device("npu", index))
    ptr = block.data_ptr()
    _raw[ptr] = block
    return ptr


def caching_allocator_delete(mem_ptr: int) -> None:
    """Give back a block of :func:`caching_allocator_alloc` (0, the null pointer, is ignored)."""
    if not mem_ptr:
        return
    if _raw.pop(mem_ptr, None) is None:
        raise RuntimeError(f"invalid device pointer: {mem_ptr:#x}" + pta_error(ErrCode.PTR))


# ------------------------------------------------------------------ snapshot
def memory_snapshot(mempool_id=None) -> list[dict]:
    """The segments this process holds on every card, in torch's snapshot format (``device``, ``address`` — the
    card's address of the segment —, ``total_size``, ``allocated_size``, ``segment_type``, ``blocks``...). npusim
    packs blocks into a segment without placing them by address, so a block's ``address`` is its place in the
    packing order (live blocks first, then one ``inactive`` block of the free bytes)."""
    if mempool_id is not None:
        raise RuntimeError("memory_snapshot: npusim has one memory pool per card (MemPool is not simulated)"
                           + pta_error(ErrCode.NOT_SUPPORT))
    out = []
    with storage._lock:
        storage.sweep()
        live: dict[int, list] = {}
        for b in storage._blocks.values():              # the blocks of live tensors, by segment
            if b.seg is not None:
                live.setdefault(id(b.seg), []).append(b)
        for index in storage.devices():
            for seg in storage.reservations(index).segments():
                address = seg.ptrs[0]
                blocks = []
                for b in sorted(live.get(id(seg), ()), key=lambda b: -b.size):
                    blocks.append({"address": address, "size": b.size, "requested_size": b.nbytes,
                                   "state": "active_allocated", "frames": []})
                    address += b.size
                if seg.free:
                    blocks.append({"address": address, "size": seg.free, "requested_size": 0, "state": "inactive",
                                   "frames": []})
                out.append({"device": index, "address": seg.ptrs[0], "total_size": seg.size,
                            "allocated_size": seg.used, "active_size": seg.used,
                            "requested_size": sum(b["requested_size"] for b in blocks), "stream": 0,
                            "segment_type": "small" if seg.pool == "small_pool" else "large",
                            "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks})
    return out


# ------------------------------------------------------------------ the pinned host allocator
def _no_host_allocator(call: str) -> RuntimeError:
    return RuntimeError(f"torch.npu.{call}: npusim has no caching pinned-host allocator to report on (pinned memory, "
                        f"where torch_npu/hooks.py provides it, is plain host memory counted nowhere)"
                        + pta_error(ErrCode.NOT_SUPPORT))


def host_memory_stats_as_nested_dict() -> dict:
    """torch_npu's pinned host allocator statistics: refused (see :func:`_no_host_allocator`)."""
    raise _no_host_allocator("host_memory_stats_as_nested_dict")


def host_memory_stats() -> collections.OrderedDict:
    raise _no_host_allocator("host_memory_stats")


def reset_accumulated_host_memory_stats() -> None:
    raise _no_host_allocator("reset_accumulated_host_memory_stats")


def reset_peak_host_memory_stats() -> None:
    raise _no_host_allocator("reset_peak_host_memory_stats")
