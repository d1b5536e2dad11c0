"""The memory of ``npu`` tensors: host memory each ``npu:k`` tensor owns, accounted to card k.

An ``npu`` tensor's storage is a PrivateUse1 storage on host memory: the CPU storage an operator computed into,
adopted without a copy through DLPack (the npu storage owns it and frees it when it dies). torch does not tell
Python when a storage dies, so each block keeps a weak reference to its storage and :func:`sweep` releases the
blocks whose storage is gone: when no reserved segment has room for a new block, every few hundred allocations,
and before every statistics query, so the numbers ``torch.npu.memory_allocated`` reports are exact.

While the runtime runs, each block takes room (its size rounded to 512 bytes) in a segment this process reserved
on the card as torch_npu's caching allocator does (``segments.py``): ``memory_reserved`` is what the card holds
for this process, and a segment the card refuses raises ``torch.OutOfMemoryError`` with torch_npu's text. Before
the runtime runs there is no card to ask: each block is then only counted against the config's ``hbm_bytes``
(reserved equals allocated). The bytes themselves are host memory either way (docs/torch.md).
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from . import segments
from .segments import CardRefused, Reservations, Segment, pool_of, round_size

_CPU = torch.device("cpu")
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_as_strided = torch.ops.aten.as_strided.default
_view_dtype = torch.ops.aten.view.dtype
_DL_EXT_DEV = 12                     # DLDeviceType kDLExtDev
_DEVICE_OFFSET = ctypes.sizeof(ctypes.c_void_p)    # DLTensor: void *data; DLDevice device; ...
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
SWEEP_EVERY = 256                    # allocations between sweeps when every block finds room


@dataclass
class _Block:
    device: int
    nbytes: int                      # the tensor storage's bytes (what memory_allocated counts)
    size: int                        # the block: nbytes rounded to 512, the room it takes in its segment
    seg: Segment | None              # None: counted only (made while the runtime was not running)
    ref: StorageWeakRef              # the npu storage (it owns the bytes)


@dataclass
class Stat:
    """One statistic as torch's allocator keeps it: ``current``, ``peak``, ``allocated`` (total), ``freed``."""
    current: int = 0
    peak: int = 0
    allocated: int = 0
    freed: int = 0

    def add(self, n: int) -> None:
        self.current += n
        self.allocated += n
        self.peak = max(self.peak, self.current)

    def sub(self, n: int) -> None:
        self.current -= n
        self.freed += n


POOLS = ("all", "small_pool", "large_pool")


def _stats_table() -> dict:
    return {p: Stat() for p in POOLS}


@dataclass
class DeviceStats:
    """One card's counters in torch's ``memory_stats`` sense, per pool: live blocks (``nbytes``, ``count``) and
    reserved segments (``reserved``, ``segments``; a counted-only block is its own segment)."""
    nbytes: dict = field(default_factory=_stats_table)
    count: dict = field(default_factory=_stats_table)
    reserved: dict = field(default_factory=_stats_table)
    segments: dict = field(default_factory=_stats_table)
    num_ooms: int = 0
    num_alloc_retries: int = 0

    @property
    def current(self) -> int:
        return self.nbytes["all"].current

    def add(self, n: int) -> None:
        for pool in ("all", pool_of(n)):
            self.nbytes[pool].add(n)
            self.count[pool].add(1)

    def sub(self, n: int) -> None:
        for pool in ("all", pool_of(n)):
            self.nbytes[pool].sub(n)
            self.count[pool].sub(1)

    def add_segment(self, pool: str, size: int) -> None:
        for p in ("all", pool):
            self.reserved[p].add(size)
            self.segments[p].add(1)

    def sub_segment(self, pool: str, size: int) -> None:
        for p in ("all", pool):
            self.reserved[p].sub(size)
            self.segments[p].sub(1)

    def reset_peak(self) -> None:
        for table in (self.nbytes, self.count, self.reserved, self.segments):
            for st in table.values():
                st.peak = st.current


_lock = threading.RLock()
_blocks: dict[int, _Block] = {}      # host data pointer -> block
_stats: dict[int, DeviceStats] = {}
_reservations: dict[int, Reservations] = {}
_since_sweep = 0
_config_hbm: dict[str | None, int] = {}


def format_size(nbytes: int) -> str:
    """torch_npu's size text (``format_size`` of NPUCachingAllocator)."""
    if nbytes <= 1024:
        return f"{nbytes} bytes"
    if nbytes <= 1 << 20:
        return f"{nbytes / 1024:.2f} KiB"
    if nbytes <= 1 << 30:
        return f"{nbytes / (1 << 20):.2f} MiB"
    return f"{nbytes / (1 << 30):.2f} GiB"


def capacity(device: int) -> int:
    """Card ``device``'s HBM bytes: the runtime's device info once it runs, else the config's ``hbm_bytes`` (read
    once per ``NPUSIM_CONFIG`` value)."""
    import rt
    if rt.is_initialized():
        return int(rt.get_device_info(device).total_memory)
    key = os.environ.get("NPUSIM_CONFIG")
    cap = _config_hbm.get(key)
    if cap is None:
        from rt.config import load_config
        cap = _config_hbm[key] = int(load_config(None).hbm_bytes)
    return cap


def stats(device: int) -> DeviceStats:
    with _lock:
        st = _stats.get(device)
        if st is None:
            st = _stats[device] = DeviceStats()
        return st


def _res(device: int) -> Reservations:
    res = _reservations.get(device)
    if res is None:
        res = _reservations[device] = Reservations(device)
    return res


def reservations(device: int) -> Reservations:
    """This process's segments on card ``device``, without those the card already released (context gone)."""
    with _lock:
        res = _res(device)
        st = stats(device)
        for seg in res.dead():
            st.sub_segment(seg.pool, seg.size)
        return res


def devices() -> list[int]:
    """The devices this process has reserved or counted memory on."""
    with _lock:
        return sorted(_stats)


def sweep() -> int:
    """Release the blocks whose npu storage no longer exists; returns the bytes released."""
    global _since_sweep
    released = 0
    with _lock:
        _since_sweep = 0
        dead = [ptr for ptr, b in _blocks.items() if b.ref.expired()]
        for ptr in dead:
            released += _release(ptr)
    return released


def _release(ptr: int) -> int:
    b = _blocks.pop(ptr)
    st = _stats[b.device]
    st.sub(b.nbytes)
    if b.seg is None:
        st.sub_segment(pool_of(b.nbytes), b.nbytes)
    else:
        b.seg.used -= b.size
    return b.nbytes


def release_unused(device: int) -> int:
    """Give this process's segments on card ``device`` that hold no live block back to the card; returns bytes."""
    with _lock:
        st = stats(device)
        freed = reservations(device).release_unused()
        for seg in freed:
            st.sub_segment(seg.pool, seg.size)
        return sum(seg.size for seg in freed)


def _place(device: int, nbytes: int, size: int) -> Segment | None:
    """Account ``nbytes`` more on card ``device`` (a block of ``size``): room in a reserved segment (the card's), or
    a count against the capacity when the runtime is not running; torch_npu's out-of-memory error when neither
    fits."""
    global _since_sweep
    _since_sweep += 1
    if _since_sweep >= SWEEP_EVERY:
        sweep()
    st = stats(device)
    if not segments.card_ready():
        check_fits(device, nbytes)
        st.add(nbytes)
        st.add_segment(pool_of(nbytes), nbytes)
        return None
    seg = _room(device, size)
    seg.used += size
    st.add(nbytes)
    return seg


def _room(device: int, size: int) -> Segment:
    """A segment of card ``device`` with ``size`` free bytes: a reserved one (after a sweep if need be), else a
    new one from the card; after a refusal the unused segments go back to the card and it is asked once more."""
    res = _res(device)
    seg = res.find(size)
    if seg is None:
        res = reservations(device)
        if sweep():
            seg = res.find(size)
    if seg is not None:
        return seg
    st = stats(device)
    try:
        seg = res.reserve(size)
    except CardRefused:
        st.num_alloc_retries += 1
        release_unused(device)
        try:
            seg = res.reserve(size)
        except CardRefused as e:
            st.num_ooms += 1
            raise _oom(device, e.size, e.total, e.free, st, e.allowed) from None
    st.add_segment(seg.pool, seg.size)
    return seg


def _oom(device: int, size: int, total: int, free: int, st: DeviceStats,
         allowed: int | None = None) -> torch.OutOfMemoryError:
    """torch_npu's error: the segment it tried to reserve, the card's numbers and this process's (and its cap,
    when set_per_process_memory_fraction set one)."""
    cap = f"{format_size(allowed)} allowed; " if allowed is not None else ""
    return torch.OutOfMemoryError(
        f"NPU out of memory. Tried to allocate {format_size(size)} (NPU {device}; {format_size(total)} total "
        f"capacity; {format_size(st.current)} already allocated; {format_size(st.current)} current active; "
        f"{format_size(free)} free; {cap}{format_size(st.reserved['all'].current)} reserved in total by PyTorch).If "
        f"reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.")


def check_fits(device: int, nbytes: int) -> None:
    """Make sure ``nbytes`` more fit on card ``device`` (a factory asks before the host allocates): a segment with
    room, reserved now if need be; before the runtime runs, the count against the capacity. Else torch_npu's
    out-of-memory error."""
    if nbytes <= 0:
        return
    with _lock:
        if segments.card_ready():
            _room(device, round_size(nbytes))
            return
        st = stats(device)
        cap = capacity(device)
        if st.current + nbytes > cap:
            sweep()
            if st.current + nbytes > cap:
                st.num_ooms += 1
                raise _oom(device, nbytes, cap, cap - st.current, st)


def view_of(base: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """An npu tensor on ``base``'s storage with ``like``'s sizes, strides and offset (torch's CPU ``as_strided``
    kernel only records the geometry: it keeps ``base``'s device and storage). ``like`` may have another dtype
    (``view_as_real``, ``view(dtype)``): the storage is then re-read in ``like``'s elements first."""
    if like.dtype != base.dtype:
        base = _view_dtype.redispatch(_CPU_KEYS, _as_strided.redispatch(_CPU_KEYS, base, (0,), (1,), 0), like.dtype)
    return _as_strided.redispatch(_CPU_KEYS, base, like.shape, like.stride(), like.storage_offset())


def _from_host(host: torch.Tensor, device: int) -> torch.Tensor:
    """``host`` (CPU) as an ``npu:device`` tensor owning the same bytes: its DLPack capsule, relabelled as
    DLPack's extension device (which torch reads as PrivateUse1), keeps ``host`` alive until the npu tensor dies."""
    capsule = torch.utils.dlpack.to_dlpack(host)
    where = (ctypes.c_int32 * 2).from_address(_capsule_pointer(capsule, b"dltensor") + _DEVICE_OFFSET)
    where[0], where[1] = _DL_EXT_DEV, device
    return torch._C._from_dlpack(capsule)


def adopt(host: torch.Tensor, device: int) -> torch.Tensor:
    """``host`` (a fresh CPU result no one else holds) as an ``npu:device`` tensor on the same bytes, accounted to
    the card."""
    st = host.untyped_storage()
    nbytes = st.nbytes()
    out = None
    if host.storage_offset() == 0 and host.is_contiguous() and host.numel() * host.element_size() == nbytes:
        try:
            out = _from_host(host, device)
        except (RuntimeError, BufferError, TypeError):   # a dtype DLPack has no code for
            out = None
    if out is None:                  # a strided result (or such a dtype): adopt its whole storage as bytes, view it
        flat = torch.empty((0,), dtype=torch.uint8).set_(st, 0, (nbytes,), (1,))
        base = _view_dtype.redispatch(_CPU_KEYS, _from_host(flat, device), host.dtype)
        out = _as_strided.redispatch(_CPU_KEYS, base, host.shape, host.stride(), host.storage_offset())
    if nbytes:
        with _lock:
            ptr = out.untyped_storage().data_ptr()
            if ptr in _blocks:       # freed memory the host allocator handed out again before a sweep
                _release(ptr)
            size = round_size(nbytes)
            _blocks[ptr] = _Block(device, nbytes, size, _place(device, nbytes, size),
                                  StorageWeakRef(out.untyped_storage()))
    return out


def resized(device: int, old_ptr: int, new_ptr: int, nbytes: int, ref: StorageWeakRef) -> None:
    """Account an npu storage's resize (``hooks.cpp``: ``UntypedStorage.resize_``): its new host block of ``nbytes``
    at ``new_ptr`` (none when 0) takes room on card ``device`` — torch_npu's out-of-memory error if the card refuses
    it — and then the old block at ``old_ptr`` is released, as torch_npu's allocator allocates before it frees."""
    with _lock:
        if nbytes:
            if new_ptr in _blocks:   # freed memory the host allocator handed out again before a sweep
                _release(new_ptr)
            size = round_size(nbytes)
            _blocks[new_ptr] = _Block(device, nbytes, size, _place(device, nbytes, size), ref)
        if old_ptr in _blocks:
            _release(old_ptr)


def host_storage(t: torch.Tensor) -> torch.UntypedStorage:
    """A CPU storage on an npu tensor's bytes (it does not own them: the npu storage does)."""
    st = t.untyped_storage()
    return torch._C._construct_storage_from_data_pointer(st.data_ptr(), _CPU, st.nbytes())


def host_bytes(store: torch.UntypedStorage) -> torch.Tensor:
    """A CPU uint8 tensor on all of a storage's bytes (an npu or CPU one; no copy)."""
    nbytes = store.nbytes()
    if store.device.type != "cpu":
        store = torch._C._construct_storage_from_data_pointer(store.data_ptr(), _CPU, nbytes)
    return torch.empty((0,), dtype=torch.uint8).set_(store, 0, (nbytes,), (1,))


def cpu_view(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor on the same bytes as npu tensor ``t`` (same sizes, strides, offset; no copy, no autograd)."""
    view = torch.empty((0,), dtype=t.dtype)
    return view.set_(host_storage(t), t.storage_offset(), t.shape, t.stride())
