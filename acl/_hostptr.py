"""Host memory as integer addresses, the way pyACL programs pass it — checked, where real pyACL would crash.

A pyACL program holds host memory as raw ints: ``malloc_host`` returns one, ``util.numpy_to_ptr(a)`` and
``util.bytes_to_ptr(b)`` give the address of an object's storage, and ``memcpy``/``memset`` take them on
either side. This module keeps a registry of every host region the program was given an address for, so an
address can be turned back into a buffer ``rt`` copies to and from — a pinned ``HostBuffer`` (the fast path),
a numpy array, or a ``bytes`` object's storage (real samples copy device→host *into* a ``bytes`` and read it
with ``np.frombuffer``) — and so a freed or out-of-range address of such a region is an error naming it
instead of a segfault. Any other host address (``torch.Tensor.data_ptr()``, a ``ctypes`` buffer, an mmap)
is accepted when the process's memory map (``rt/host/procmaps.py``) says the range is mapped with the
permission the call needs, and refused with 107000 naming the address and range otherwise.

Lifetimes follow pyACL's rule — the object must outlive its pointer — without keeping the program's objects
alive: numpy arrays are held weakly (once one is gone its memory may hold anything, so its region is
forgotten and an address in it is judged by the memory map like any other), ``bytes`` (which cannot be
weakly referenced) are dropped from the registry once the program no longer holds them (their reference
count says so), pinned buffers until ``free_host``.
"""

from __future__ import annotations

import bisect
import ctypes
import sys
import threading
import weakref

import numpy as np

from rt.constants import AclErrorCode as E
from rt.errors import AclError
from rt.host.procmaps import unmapped

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:                                    # numpy < 2
    byte_bounds = np.byte_bounds

PINNED, ARRAY, BYTES = "malloc_host", "numpy_to_ptr", "bytes_to_ptr"
SWEEP_EVERY = 64          # registrations between sweeps for bytes objects the program dropped
FREED_KEPT = 1024         # freed pinned regions remembered, to name a use after free_host
FAR = 1 << 30             # an address further than this from every region is named as no neighbour's


class _Region:
    __slots__ = ("kind", "nbytes", "ref", "start")

    def __init__(self, start, nbytes, kind, ref):
        self.start, self.nbytes, self.kind, self.ref = start, nbytes, kind, ref

    @property
    def end(self) -> int:
        return self.start + self.nbytes

    def obj(self):
        """The object behind the region, or None if it is gone."""
        return self.ref() if self.kind == ARRAY else self.ref

    def describe(self) -> str:
        return f"{self.nbytes}-byte region 0x{self.start:x} from {self.kind}"


class HostRegions:
    """Known host regions by start address (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._regions: list[_Region] = []
        self._freed: dict[int, tuple] = {}                 # start -> (size, weakref) of pinned buffers freed
        self._since_sweep = 0

    # -- registering -------------------------------------------------------------------------
    def add_pinned(self, buf) -> int:
        return self._add(_Region(buf.address, buf.nbytes, PINNED, buf))

    def add_array(self, arr: np.ndarray) -> int:
        """Register the memory the array spans and return its data pointer (what pyACL returns). For a
        strided or reversed view the two differ: the pointer of ``a[::-1]`` is its *last* byte range, so a
        copy of ``a.nbytes`` to it runs past the end of the memory and is refused, not performed."""
        low, high = byte_bounds(arr)           # the memory the elements occupy, whatever the strides
        owner = arr
        while isinstance(owner.base, np.ndarray):          # a view lives as long as the array that owns its memory:
            owner = owner.base                             # ``numpy_to_ptr(a[::-1])``'s view is gone at once, ``a`` not
        try:
            ref = weakref.ref(owner)
        except TypeError:                                  # an array subclass without weakref support
            ref = _strong(owner)
        self._add(_Region(low, high - low, ARRAY, ref))
        return arr.ctypes.data

    def add_bytes(self, data) -> int:
        """A bytes or bytearray object's storage (held until the program drops the object)."""
        return self._add(_Region(_address_of(data), len(data), BYTES, data))

    def _add(self, region: _Region) -> int:
        with self._lock:
            self._since_sweep += 1
            if self._since_sweep >= SWEEP_EVERY:
                self._sweep()
            i = bisect.bisect_left(self._starts, region.start)
            if i < len(self._starts) and self._starts[i] == region.start:
                if not self._covers(self._regions[i], region):
                    self._regions[i] = region              # the same storage registered again
            else:
                self._starts.insert(i, region.start)
                self._regions.insert(i, region)
            self._freed.pop(region.start, None)
            return region.start

    @staticmethod
    def _covers(old: _Region, new: _Region) -> bool:
        """Keep a live array already registered at this start when it spans at least as much (a view of
        it, e.g. ``a[::-1]`` starting where ``a`` does, must not make ``a``'s address die with the view)."""
        if old.kind != ARRAY or new.kind != ARRAY:
            return False
        return old.obj() is not None and old.nbytes >= new.nbytes

    def _sweep(self) -> None:
        """Forget bytes objects nobody but the registry holds, and arrays that are gone."""
        self._since_sweep = 0
        keep = [r for r in self._regions if not self._dead(r)]
        if len(keep) != len(self._regions):
            self._regions = keep
            self._starts = [r.start for r in keep]

    @staticmethod
    def _dead(r: _Region) -> bool:
        if r.kind == ARRAY:
            return r.ref() is None
        if r.kind == BYTES:
            return sys.getrefcount(r.ref) <= 2             # the registry's and getrefcount's own
        return False

    def remove_pinned(self, address: int, call: str):
        """Unregister the pinned buffer starting at ``address`` and return it (for free_host)."""
        with self._lock:
            i = bisect.bisect_left(self._starts, address)
            if i < len(self._starts) and self._starts[i] == address and self._regions[i].kind == PINNED:
                region = self._regions.pop(i)
                del self._starts[i]
                if len(self._freed) >= FREED_KEPT:
                    self._freed.pop(next(iter(self._freed)))
                self._freed[address] = (region.nbytes, _weak(region.ref))
                return region.ref
            freed = self._freed.get(address)
        if freed is not None:
            raise AclError(E.ACL_ERROR_RT_MEMORY_FREE, f"{call}: host address 0x{address:x} ({freed[0]} bytes from "
                                                       f"malloc_host) was freed already: a double free")
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{call}: 0x{address:x} is not an address malloc_host "
                                                     f"returned; {self._nearest(address)} (free_host takes the "
                                                     f"address malloc_host returned)")

    # -- resolving ---------------------------------------------------------------------------------
    def lookup(self, address: int, nbytes: int, call: str, arg: str, write: bool = False):
        """(region, object, offset) of the registered region holding ``[address, address + nbytes)``; None for
        memory no registered region covers that the process maps with the permission needed (``write``:
        writable; checked against the process's memory map, touching nothing); 107000 naming why not."""
        with self._lock:
            i = bisect.bisect_right(self._starts, address) - 1
            region = self._regions[i] if i >= 0 and address < self._regions[i].end + (nbytes == 0) else None
            obj = region.obj() if region is not None else None
            if obj is not None and address + nbytes <= region.end and self._intact(region, obj):
                return region, obj, address - region.start
            if region is not None and obj is None:         # its object is gone: the memory may hold another now
                del self._starts[i], self._regions[i]
                region = None
            freed_start = self._freed_containing(address) if region is None else None
            nearest = self._nearest(address)
        where = f"{call}: {arg} {nbytes} bytes at host address 0x{address:x}"
        if region is not None and not self._intact(region, obj):
            raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{where}: the bytearray behind the {region.describe()} was "
                                                         f"resized since bytes_to_ptr, so its storage moved")
        if region is not None:
            raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{where} run {address + nbytes - region.end} bytes past the "
                                                         f"end of the {region.describe()}")
        problem = unmapped(address, nbytes, write)
        if freed_start is not None:
            # still the freed buffer's pages (a view kept them), or unmapped since: a use after free; mapped by
            # something else since (the address space is reused), the address is that mapping's now
            if self._freed_open(freed_start) or problem is not None and unmapped(address, nbytes, False) is not None:
                raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{call}: {arg} host address 0x{address:x} is inside a "
                                                             f"malloc_host buffer (0x{freed_start:x}) that free_host "
                                                             f"released: a use after free")
            with self._lock:
                self._freed.pop(freed_start, None)
        if problem is None:
            return None                                    # memory of the process's own: torch, ctypes, mmap ...
        near = "" if "nowhere near" in nearest or "no host region" in nearest else f"; {nearest}"
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID,
                       f"{call}: {arg} 0x{address:x} is neither a device address nor host memory this process can "
                       f"{'write' if write else 'read'}: [0x{address:x}, 0x{address + nbytes:x}) ({nbytes} bytes): "
                       f"{problem}{near}")

    @staticmethod
    def _intact(region: _Region, obj) -> bool:
        """A bytearray can be resized (and its storage moved) after bytes_to_ptr; a bytes object cannot."""
        if isinstance(obj, bytearray):
            return len(obj) == region.nbytes and (not obj or _address_of(obj) == region.start)
        return not getattr(obj, "freed", False)

    def buffer(self, address: int, nbytes: int, call: str, arg: str, write: bool = True):
        """What ``rt.memcpy`` takes for ``nbytes`` at ``address``: a whole pinned buffer as itself (its fastest
        path), anything else as :meth:`view`."""
        found = self.lookup(address, nbytes, call, arg, write)
        if found is not None and found[0].kind == PINNED and found[2] == 0 and nbytes == found[0].nbytes:
            return found[1]
        return self._view(found, address, nbytes, call, arg, write)

    def view(self, address: int, nbytes: int, call: str, arg: str, write: bool = True) -> np.ndarray:
        """A uint8 view of ``nbytes`` at ``address`` (a pinned view stays on the pinned fast path); ``write``:
        the caller writes through it, so the memory must be mapped writable."""
        return self._view(self.lookup(address, nbytes, call, arg, write), address, nbytes, call, arg, write)

    @staticmethod
    def _view(found, address: int, nbytes: int, call: str, arg: str, write: bool) -> np.ndarray:
        if found is not None:
            region, obj, off = found
            if region.kind == PINNED:
                return np.frombuffer(obj, np.uint8, nbytes, off)
            if region.kind == ARRAY and obj.flags.c_contiguous and obj.ctypes.data == region.start and \
                    (obj.flags.writeable or not write):
                return obj.reshape(-1).view(np.uint8)[off:off + nbytes]
            # bytes storage (immutable to Python, written by pyACL programs all the same: heap, always read-write)
            # or a strided array (inside the memory it spans: lookup checked that). Only an array numpy calls
            # read-only may sit on a read-only mapping (np.memmap mode "r"), which would take the process down
            # with SIGSEGV instead of failing the call: for that one ask the process's memory map.
            problem = unmapped(address, nbytes, write) if region.kind == ARRAY and not obj.flags.writeable else None
            if problem:
                raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{call}: {arg} {nbytes} bytes at host address "
                                                             f"0x{address:x}: {problem}")
        if nbytes == 0:
            return np.empty(0, np.uint8)
        return np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(address))

    def _freed_containing(self, address: int) -> int | None:
        for start, (size, _) in self._freed.items():
            if start <= address < start + size:
                return start
        return None

    def _freed_open(self, start: int) -> bool:
        """Whether the freed pinned buffer at ``start`` still maps its pages (numpy views of it were alive)."""
        entry = self._freed.get(start)
        buf = entry[1]() if entry is not None else None
        return buf is not None and not getattr(buf, "closed", True)

    def _nearest(self, address: int) -> str:
        if not self._regions:
            return "no host region is registered"
        i = bisect.bisect_right(self._starts, address)
        near = self._regions[max(i - 1, 0):i + 1]
        best = min(near, key=lambda r: abs(r.start - address) if address < r.start else max(address - r.end, 0))
        if max(best.start - address, address - best.end) > FAR:
            return f"it is nowhere near any of the {len(self._regions)} host regions this process registered"
        if address < best.start:
            return f"the nearest known region is the {best.describe()}, {best.start - address} bytes above"
        if address < best.end:
            return f"it is {address - best.start} bytes into the {best.describe()}"
        return f"the nearest known region is the {best.describe()}, which ends {address - best.end} bytes below"


def _weak(obj):
    """A weak reference to ``obj`` where it allows one, else a callable returning None (treated as gone)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: None


def _strong(obj):
    """A callable returning ``obj``: a weakref stand-in that holds it."""
    return lambda: obj


def _address_of(data) -> int:
    if isinstance(data, bytes):
        return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0
    return np.frombuffer(data, np.uint8).ctypes.data if data else 0     # a bytearray (the export ends at once)


REGIONS = HostRegions()
