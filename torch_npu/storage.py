"""The memory of ``npu`` tensors: host memory each ``npu:k`` tensor owns, counted against card k's HBM capacity.

An ``npu`` tensor's storage is a PrivateUse1 storage on host memory: the CPU storage an operator computed into,
adopted without a copy through DLPack (the npu storage owns it and frees it when it dies). torch does not tell
Python when a storage dies, so each counted block keeps a weak reference to its storage and :func:`sweep`
uncounts the blocks whose storage is gone: when an allocation would pass the card's capacity, every few hundred
allocations, and before every statistics query, so the numbers ``torch.npu.memory_allocated`` reports are exact.

The bytes are counted per card in torch_npu's ``memory_stats`` keys; an allocation that would pass the card's
HBM capacity (``rt.get_device_info(k).total_memory``, the config's ``hbm_bytes`` before the runtime starts)
raises ``torch.OutOfMemoryError`` with torch_npu's text. The card's own allocator (``rt.get_mem_info``) does
not see these bytes: they are not in card memory (docs/torch.md).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef

_CPU = torch.device("cpu")
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_as_strided = torch.ops.aten.as_strided.default
_view_dtype = torch.ops.aten.view.dtype
_DL_EXT_DEV = 12                     # DLDeviceType kDLExtDev
_DEVICE_OFFSET = ctypes.sizeof(ctypes.c_void_p)    # DLTensor: void *data; DLDevice device; ...
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
SWEEP_EVERY = 256                    # allocations between sweeps when nothing is near capacity


@dataclass
class _Block:
    device: int
    nbytes: int
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
SMALL_BLOCK = 1 << 20                # torch's small pool: blocks of at most 1 MiB


@dataclass
class DeviceStats:
    """One card's counters in torch's ``memory_stats`` sense, per pool (no cache: reserved == allocated)."""
    nbytes: dict = field(default_factory=lambda: {p: Stat() for p in POOLS})
    count: dict = field(default_factory=lambda: {p: Stat() for p in POOLS})
    num_ooms: int = 0
    capacity: int | None = None

    @property
    def current(self) -> int:
        return self.nbytes["all"].current

    def add(self, n: int) -> None:
        for pool in ("all", "small_pool" if n <= SMALL_BLOCK else "large_pool"):
            self.nbytes[pool].add(n)
            self.count[pool].add(1)

    def sub(self, n: int) -> None:
        for pool in ("all", "small_pool" if n <= SMALL_BLOCK else "large_pool"):
            self.nbytes[pool].sub(n)
            self.count[pool].sub(1)

    def reset_peak(self) -> None:
        for st in (*self.nbytes.values(), *self.count.values()):
            st.peak = st.current


_lock = threading.RLock()
_blocks: dict[int, _Block] = {}      # host data pointer -> block
_stats: dict[int, DeviceStats] = {}
_since_sweep = 0


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
    """Card ``device``'s HBM bytes: the runtime's device info once it runs, else the config's ``hbm_bytes``."""
    st = stats(device)
    if st.capacity is None:
        import rt
        from rt.config import load_config
        if rt.is_initialized():
            st.capacity = int(rt.get_device_info(device).total_memory)
        else:
            return int(load_config(None).hbm_bytes)
    return st.capacity


def stats(device: int) -> DeviceStats:
    with _lock:
        st = _stats.get(device)
        if st is None:
            st = _stats[device] = DeviceStats()
        return st


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
    _stats[b.device].sub(b.nbytes)
    return b.nbytes


def _reserve(device: int, nbytes: int) -> None:
    """Count ``nbytes`` on card ``device``, or raise torch_npu's out-of-memory error."""
    global _since_sweep
    _since_sweep += 1
    if _since_sweep >= SWEEP_EVERY:
        sweep()
    check_fits(device, nbytes)
    stats(device).add(nbytes)


def check_fits(device: int, nbytes: int) -> None:
    """Raise torch_npu's out-of-memory error if ``nbytes`` more do not fit on card ``device``."""
    st = stats(device)
    cap = capacity(device)
    if st.current + nbytes > cap:
        sweep()
        if st.current + nbytes > cap:
            st.num_ooms += 1
            free = cap - st.current
            raise torch.OutOfMemoryError(
                f"NPU out of memory. Tried to allocate {format_size(nbytes)} (NPU {device}; {format_size(cap)} "
                f"total capacity; {format_size(st.current)} already allocated; {format_size(st.current)} current "
                f"active; {format_size(free)} free; {format_size(st.current)} reserved in total by PyTorch).If "
                f"reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.")


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
    """``host`` (a fresh CPU result no one else holds) as an ``npu:device`` tensor on the same bytes, counted on
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
            _reserve(device, nbytes)
            _blocks[ptr] = _Block(device, nbytes, StorageWeakRef(out.untyped_storage()))
    return out


def host_storage(t: torch.Tensor) -> torch.UntypedStorage:
    """A CPU storage on an npu tensor's bytes (it does not own them: the npu storage does)."""
    st = t.untyped_storage()
    return torch._C._construct_storage_from_data_pointer(st.data_ptr(), _CPU, st.nbytes())


def cpu_view(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor on the same bytes as npu tensor ``t`` (same sizes, strides, offset; no copy, no autograd)."""
    view = torch.empty((0,), dtype=t.dtype)
    return view.set_(host_storage(t), t.storage_offset(), t.shape, t.stride())
