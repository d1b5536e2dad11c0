"""``acl.util`` (pointer helpers and threads) and ``acl.media`` (DVPP memory) as pyACL has them.

``bytes_to_ptr`` / ``numpy_to_ptr`` return the address of the object's storage and register it
(``acl/_hostptr.py``), so ``memcpy`` can read and write it and ``ptr_to_bytes`` / ``ptr_to_numpy`` read it
back — bounds-checked: an address npusim never handed out is an error with a message, not a crash.
``start_thread(fn, args)`` runs ``fn(args)`` on a new thread and returns its native id, the id
``acl.rt.subscribe_report`` takes.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np

import rt
from rt import args
from rt.constants import AclErrorCode as E
from rt.errors import AclError

from ._callbacks import SUBSCRIPTIONS
from ._core import code, plain, values
from ._hostptr import REGIONS

# NumPy's type numbers, as ptr_to_numpy takes them (NPY_BOOL = 0 ... NPY_HALF = 23)
NPY_TYPES = {0: np.bool_, 1: np.int8, 2: np.uint8, 3: np.int16, 4: np.uint16, 5: np.int32, 6: np.uint32,
             7: np.int64, 8: np.uint64, 9: np.int64, 10: np.uint64, 11: np.float32, 12: np.float64, 23: np.float16}
STOP_WAIT = 30.0          # seconds stop_thread waits for the thread to end


def bytes_to_ptr(data) -> int:
    """The address of a bytes object's storage (no copy; pyACL: the object must outlive the pointer).
    A bytearray works too. Anything else raises ValueError, as pyACL's binding does."""
    if not isinstance(data, (bytes, bytearray)):
        raise ValueError(f"acl.util.bytes_to_ptr: needs a bytes object as argument, got {args.shown(data)}")  # noqa: TRY004
    return REGIONS.add_bytes(data)


def numpy_to_ptr(array) -> int:
    """The address of a numpy array's data (deprecated in pyACL in favour of bytes_to_ptr, still common).
    A non-array raises ValueError, as pyACL's binding does."""
    if not isinstance(array, np.ndarray):
        raise ValueError(f"acl.util.numpy_to_ptr: needs an ndarray as argument, got {args.shown(array)}")  # noqa: TRY004
    if not array.flags.c_contiguous:
        warnings.warn("acl.util.numpy_to_ptr: the input ndarray is discontiguous, so a copy through its address "
                      "would see its memory, not its elements in order; use acl.util.numpy_contiguous_to_ptr",
                      RuntimeWarning, stacklevel=2)
    return REGIONS.add_array(array)


def numpy_contiguous_to_ptr(array):
    """``(ptr, data_out)``: ``data_out`` is the array made contiguous (the caller keeps it alive)."""
    if not isinstance(array, np.ndarray):
        raise ValueError(f"acl.util.numpy_contiguous_to_ptr: needs an ndarray as argument, got {args.shown(array)}")  # noqa: TRY004
    contiguous = np.ascontiguousarray(array)
    return REGIONS.add_array(contiguous), contiguous


@plain("util.ptr_to_bytes", b"")
def ptr_to_bytes(ptr, size) -> bytes:
    """A copy of ``size`` bytes at a host address."""
    _check_ptr(ptr, size, "util.ptr_to_bytes")
    return REGIONS.view(int(ptr), int(size), "util.ptr_to_bytes", "ptr", write=False).tobytes()


@plain("util.ptr_to_numpy", None)
def ptr_to_numpy(ptr, shape, npy_type):
    """A writable ndarray view of host memory at ``ptr`` (shape a tuple of ints, dtype a NumPy type number)."""
    if not args.is_int(npy_type) or int(npy_type) not in NPY_TYPES:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"util.ptr_to_numpy: NumPy type number {args.shown(npy_type)} "
                                                  f"is not one of {sorted(NPY_TYPES)}")
    dims = args.int_list(list(shape) if isinstance(shape, tuple) else shape, "util.ptr_to_numpy", "shape")
    dtype = np.dtype(NPY_TYPES[int(npy_type)])
    nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    _check_ptr(ptr, nbytes, "util.ptr_to_numpy")
    return REGIONS.view(int(ptr), nbytes, "util.ptr_to_numpy", "ptr").view(dtype).reshape(dims)


def _check_ptr(ptr, size, call):
    if not args.is_int(ptr) or not args.is_int(size) or size < 0:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: ptr {args.shown(ptr)} and size {args.shown(size)} "
                                                  f"must be ints (size >= 0)")


_threads: dict[int, threading.Thread] = {}
_threads_lock = threading.Lock()


@values("util.start_thread", 0)
def start_thread(func, args_list):
    """Run ``func(args_list)`` on a new thread; returns its native thread id."""
    if not callable(func):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"util.start_thread: {args.shown(func)} is not callable")
    started = threading.Event()
    ids = []

    def body():
        ids.append(threading.get_native_id())
        SUBSCRIPTIONS.adopt(ids[0])
        started.set()
        func(args_list)
    t = threading.Thread(target=body, name="acl-util-thread", daemon=True)
    t.start()
    started.wait()
    with _threads_lock:
        _threads[ids[0]] = t
    return ids[0]


@code("util.stop_thread")
def stop_thread(thread_id):
    """Wait for the thread (the program has told it to stop) to end."""
    with _threads_lock:
        t = _threads.pop(thread_id, None) if args.is_int(thread_id) else None
    if t is None:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"util.stop_thread: {args.shown(thread_id)} is not a thread "
                                                  f"util.start_thread started (or it was stopped already)")
    t.join(STOP_WAIT)
    if t.is_alive():
        raise AclError(E.ACL_ERROR_RT_WAIT_TIMEOUT, f"util.stop_thread: thread {thread_id} is still running after "
                                                    f"{STOP_WAIT:g} s (its loop never saw the stop)")


# ---------------------------------------------------------------------------------------------- acl.media
@values("media.dvpp_malloc", 0)
def dvpp_malloc(size):
    """Device memory for DVPP buffers (npusim's addresses are 512-aligned: more than DVPP's 128)."""
    return rt.malloc(size)


@code("media.dvpp_free")
def dvpp_free(dev_ptr):
    rt.free(dev_ptr)


__all__ = ["bytes_to_ptr", "numpy_contiguous_to_ptr", "numpy_to_ptr", "ptr_to_bytes", "ptr_to_numpy", "start_thread", "stop_thread"]
