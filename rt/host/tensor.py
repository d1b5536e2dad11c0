"""``rt.Tensor`` (device pointer + shape + dtype), ``rt.empty``, ``rt.launch_kernel`` and ``@rt.kernel``."""

from __future__ import annotations

import math
import sys

import cloudpickle
import numpy as np

from .. import args
from ..addresses import decode_addr
from ..constants import AclErrorCode as E, MemcpyKind
from ..dtypes import np_dtype
from ..errors import EL0004, AclError
from ..kernels import registry
from .copies import memcpy, memcpy_async
from .streams import synchronize_device
from .memory import free, malloc
from .runtime import RUNTIME
from .seam import SEAM
from .streams import current_stream


class Tensor:
    """A typed view of device memory. ``Tensor.from_numpy(a)`` uploads; ``t.numpy()`` downloads."""

    __slots__ = ("ptr", "shape", "dtype", "owns", "ctx", "_freed")

    def __init__(self, ptr: int, shape, dtype, *, owns: bool = False, ctx=None):
        if decode_addr(ptr) is None:
            raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"Tensor: {args.shown(ptr)} is not a device address")
        self.ptr = int(ptr)
        self.dtype = np_dtype(dtype)
        self.shape = check_shape(shape, "Tensor", self.dtype)
        self.owns = owns
        self.ctx = ctx or RUNTIME.current
        self._freed = False

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def size(self) -> int:
        """Elements: the product of the shape's ints (``check_shape`` bounds it), in Python — numpy's ``prod``
        costs microseconds of array set-up for a tuple, on every collective of a tensor."""
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def device(self) -> int | None:
        return None if self.ctx is None else self.ctx.device

    @classmethod
    def from_numpy(cls, array, stream=None) -> "Tensor":
        """Allocate on the current device and copy ``array`` in (synchronously unless ``stream`` is given)."""
        a = np.asarray(array, order="C")          # (ascontiguousarray would turn a 0-d array into 1-d)
        t = empty(a.shape, a.dtype)
        if a.nbytes:
            if stream is None:
                memcpy(t.ptr, t.nbytes, a, a.nbytes, MemcpyKind.ACL_MEMCPY_HOST_TO_DEVICE)
            else:
                memcpy_async(t.ptr, t.nbytes, a, a.nbytes, MemcpyKind.ACL_MEMCPY_HOST_TO_DEVICE, stream)
        return t

    def numpy(self, sync: bool = True) -> np.ndarray:
        """Copy to a new host array, after the work queued in this tensor's context (unless sync=False)."""
        self._check("numpy")
        out = np.empty(self.shape, self.dtype)
        with RUNTIME.using(self.ctx):
            if sync:
                synchronize_device()
            if out.nbytes:
                memcpy(out, out.nbytes, self.ptr, self.nbytes, MemcpyKind.ACL_MEMCPY_DEVICE_TO_HOST)
        return out

    def copy_from(self, array, stream=None) -> None:
        a = np.asarray(array, dtype=self.dtype, order="C")
        if a.shape != self.shape:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"copy_from: shape {a.shape} != tensor shape {self.shape}")
        if stream is None:
            memcpy(self.ptr, self.nbytes, a, a.nbytes, MemcpyKind.ACL_MEMCPY_HOST_TO_DEVICE)
        else:
            memcpy_async(self.ptr, self.nbytes, a, a.nbytes, MemcpyKind.ACL_MEMCPY_HOST_TO_DEVICE, stream)

    def view(self, shape=None, dtype=None, offset: int = 0) -> "Tensor":
        """Another Tensor over the same memory (no copy): reshape, reinterpret or offset in bytes."""
        offset = args.integer(offset, "Tensor.view", "offset", hi=max(self.nbytes, 0))
        t = Tensor(self.ptr + offset, self.shape if shape is None else shape,
                   self.dtype if dtype is None else dtype, ctx=self.ctx)
        if offset < 0 or offset + t.nbytes > self.nbytes:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"view: {t.nbytes} bytes at offset {offset} exceed {self.nbytes}")
        return t

    def free(self) -> None:
        self._check("free")
        with RUNTIME.using(self.ctx):
            free(self.ptr)
        self._freed = True

    def _check(self, call):
        if self._freed:
            raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"Tensor.{call}: tensor at {self.ptr:#x} was freed")

    def spec(self):
        return registry.TensorSpec(self.shape, self.dtype)

    def wire(self) -> list:
        return [self.ptr, list(self.shape), self.dtype.name]

    def __repr__(self) -> str:
        return f"Tensor(ptr={self.ptr:#x}, shape={self.shape}, dtype={self.dtype})"


MAX_DIMS = 32


def check_shape(shape, call: str, dtype: np.dtype) -> tuple[int, ...]:
    """A shape as a tuple of non-negative ints (an int alone is one dim) whose bytes fit a 64-bit size."""
    dims = [shape] if args.is_int(shape) else shape
    if isinstance(dims, np.ndarray) and dims.ndim == 1 and dims.dtype.kind in "iu":
        dims = dims.tolist()
    if not isinstance(dims, (list, tuple)) or len(dims) > MAX_DIMS or \
            not all(args.is_int(d) and 0 <= d <= args.INT64_MAX for d in dims):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: shape {args.shown(shape)} is not a list of at most "
                                                  f"{MAX_DIMS} non-negative ints")
    dims = tuple(int(d) for d in dims)
    nbytes = math.prod(dims) * dtype.itemsize
    if nbytes > args.INT64_MAX:
        raise AclError(E.ACL_ERROR_RT_MEMORY_ALLOCATION, f"{EL0004} {call}: shape {dims} of {dtype} holds {nbytes} "
                                                         f"bytes, beyond any card")
    return dims


def empty(shape, dtype="float32") -> Tensor:
    """An uninitialised tensor on the current device."""
    dt = np_dtype(dtype)
    shape = check_shape(shape, "empty", dt)
    n = math.prod(shape) * dt.itemsize
    return Tensor(malloc(max(n, 1)), shape, dt, owns=True)


class KernelFunction:
    """A ``@rt.kernel`` function: ``fn(*inputs, *outputs, **attrs)`` over numpy views, run on the card."""

    def __init__(self, fn, name: str | None = None):
        self.fn = fn
        self.name = name or f"user:{fn.__module__}.{fn.__qualname__}"
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", self.name)
        self._blob = None

    def blob(self) -> bytes:
        if self._blob is None:
            mod = sys.modules.get(self.fn.__module__)
            if mod is not None and self.fn.__module__ != "__main__":
                cloudpickle.register_pickle_by_value(mod)   # test modules are not importable on the card
                try:
                    self._blob = cloudpickle.dumps(self.fn)
                finally:
                    cloudpickle.unregister_pickle_by_value(mod)
            else:
                self._blob = cloudpickle.dumps(self.fn)
        return self._blob

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self):
        return f"<rt.kernel {self.name}>"


def kernel(arg=None):
    """Register a Python kernel: ``@rt.kernel`` or ``@rt.kernel("name")``."""
    if callable(arg):
        return KernelFunction(arg)
    if arg is not None and (not isinstance(arg, str) or not arg):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"kernel: {args.shown(arg)} is neither a function nor a kernel name")

    def wrap(fn):
        return KernelFunction(fn, arg)
    return wrap


def launch_kernel(op, inputs, outputs, attrs=None, stream=None) -> None:
    """Enqueue kernel ``op`` (a built-in name or an ``@rt.kernel``) on ``stream``; returns at once."""
    st = current_stream(stream, "launch_kernel")
    inputs = args.sequence(inputs, "launch_kernel", "inputs")
    outputs = args.sequence(outputs, "launch_kernel", "outputs")
    if attrs is not None and not isinstance(attrs, dict):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"launch_kernel: attrs must be a dict, got {args.shown(attrs)}")
    attrs = dict(attrs or {})
    for role, ts in (("input", inputs), ("output", outputs)):
        for i, t in enumerate(ts):
            if not isinstance(t, Tensor):
                raise AclError(E.ACL_ERROR_INVALID_PARAM, f"launch_kernel: {role} {i} is {type(t).__name__}, "
                                                          f"expected rt.Tensor")
            t._check("launch_kernel")
    if isinstance(op, KernelFunction):
        if op.name not in st.ctx.kernels:
            st.ctx.client.call("kernel_register", op.name, op.blob())
            st.ctx.kernels.add(op.name)
        name = op.name
    elif isinstance(op, str):
        opdef = registry.get_op(op)
        name = opdef.name
        registry.infer(name, [t.spec() for t in inputs], attrs)   # shape/dtype errors before launch
    else:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"launch_kernel: op {args.shown(op)} is neither a kernel name "
                                                  f"nor @rt.kernel")
    st.ctx.client.submit(st.id, "kernel", name, [t.wire() for t in inputs], [t.wire() for t in outputs], attrs)
    if SEAM.accesses:
        outs = [("dev", t.ptr, t.nbytes) for t in outputs]
        user = isinstance(op, KernelFunction)       # a user kernel may read its outputs too (conservative)
        SEAM.enqueued(st, f"kernel {name}", [("dev", t.ptr, t.nbytes) for t in inputs] + (outs if user else []), outs)


def sleep_kernel(seconds: float, stream=None) -> None:
    """Occupy ``stream`` on the card for ``seconds`` (a stand-in for a long kernel in tests and demos)."""
    seconds = args.number(seconds, "sleep_kernel", "seconds", hi=86400.0)
    st = current_stream(stream, "sleep_kernel")
    st.ctx.client.submit(st.id, "sleep", seconds)
