"""The ``npu`` device: PyTorch's PrivateUse1 backend, named ``npu``, whose kernels are torch's CPU kernels.

Every ATen operator that reaches the PrivateUse1 key (composite operators decompose first, autograd runs above)
lands in one boxed fallback: it replaces each ``npu`` tensor argument by a CPU tensor on the same bytes
(:func:`storage.cpu_view`) and each ``npu`` device by ``cpu``, runs the operator's CPU kernel, and gives the
results back as ``npu`` tensors — an in-place or ``out=`` result as the argument itself, a view as an ``npu``
tensor on the argument's storage, a new tensor by adopting the CPU result's memory (no copy) onto the card of
the arguments (``storage.adopt``, which counts it against the card's capacity).

Device rules are torch's: tensors of one operator must be on one device (``Expected all tensors to be on the
same device, but found at least two devices, npu:0 and cpu!``) except copies between devices, 0-dim CPU
scalars and CPU index tensors; ``t.numpy()`` needs ``t.cpu()`` first.
"""

from __future__ import annotations

import functools

import torch

from . import device_guard, hooks, storage

_CPU = torch.device("cpu")
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_CROSS_DEVICE = {"aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize", "aten::index", "aten::index_put_",
                 "aten::_index_put_impl_", "aten::index_put"}     # every overload: CPU index tensors are allowed
_FACTORIES = ("aten::empty", "aten::empty_strided")
_set = torch.ops.aten.set_.source_Storage_storage_offset
_library = None
_kernels = None


def current_index() -> int:
    """The index ``torch.device("npu")`` means: ``torch.npu.current_device()``."""
    return torch.npu.current_device()


class _Signature:
    """For one operator: which returns are written arguments (returned as the argument objects themselves)."""
    __slots__ = ("cross_device", "name", "outs", "written")

    def __init__(self, op) -> None:
        schema = op._schema
        self.name = schema.name
        self.cross_device = schema.name in _CROSS_DEVICE
        args = {}
        outs = []
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                args[frozenset(a.alias_info.before_set)] = (i, a.name, a.kwarg_only)
                if a.is_out:
                    outs.append((i, a.name, a.kwarg_only))
        self.outs = outs          # ``out=`` arguments, which the kernel sizes (not ``self`` of an in-place op)
        self.written = []
        for r in schema.returns:
            info = r.alias_info
            self.written.append(args.get(frozenset(info.before_set)) if info is not None and info.is_write else None)


_signatures: dict = {}


def _signature(op) -> _Signature:
    sig = _signatures.get(op)
    if sig is None:
        sig = _signatures[op] = _Signature(op)
    return sig


def _factory_nbytes(name: str, args, kwargs) -> int:
    """Bytes ``empty``/``empty_strided`` will allocate (checked against the card before the host allocates)."""
    size = list(args[0])
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    if any(n == 0 for n in size):
        return 0
    if name == "aten::empty_strided":
        extent = 1 + sum((n - 1) * st for n, st in zip(size, args[1]))
    else:
        extent = 1
        for n in size:
            extent *= n
    return extent * dtype.itemsize


def _same_device_error(a, b) -> RuntimeError:
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, {a} and {b}!")


def _fallback(op, *args, **kwargs):
    """Run ``op`` with torch's CPU kernel on CPU views of its npu arguments (see the module docstring)."""
    sig = _signature(op)
    if sig.name == "aten::set_":
        return op.redispatch(_CPU_KEYS, *args, **kwargs)
    if sig.name == "aten::resize_":
        return _resize(*args, **kwargs)
    if sig.name in ("aten::_copy_from", "aten::_copy_from_and_resize"):
        return _copy_from(*args, **kwargs)
    if sig.name == "aten::record_stream":            # host memory: nothing waits on a stream before reuse
        return None
    return _run_on_cpu(sig, op, args, kwargs)


def cpu_kernel(op, impl):
    """A PrivateUse1 kernel for ``op`` that runs ``impl`` (same arguments, CPU tensors in and out) as the fallback
    runs a CPU kernel: for operators torch calls only on accelerators, which have no CPU kernel."""
    sig = _signature(op)

    def kernel(*args, **kwargs):
        return _run_on_cpu(sig, impl, args, kwargs)
    return kernel


def _run_on_cpu(sig: _Signature, fn, args, kwargs):
    """``fn`` (``sig``'s operator or a CPU implementation of it) on CPU views of the npu arguments; npu results."""
    grown = []
    if sig.outs:
        args, kwargs, grown = _empty_outs(sig, args, kwargs)
    call = _Call(sig, grown)
    cargs = tuple(call.to_cpu(a) for a in args)
    ckwargs = {k: call.to_cpu(v) for k, v in kwargs.items()}
    index, cpu_seen, views = call.index, call.cpu_seen, call.views
    if call.generators:
        _check_generators(call)
    if index is None:
        index = current_index()
    if sig.name in _FACTORIES:
        storage.check_fits(index, _factory_nbytes(sig.name, args, kwargs))
    if cpu_seen is not None and call.npu_tensor and not sig.cross_device:
        raise _same_device_error(f"npu:{index}", cpu_seen)
    out = fn(*cargs, **ckwargs)
    for gen, host_gen in call.generators:
        if host_gen is not gen:
            gen.set_state(host_gen.get_state())
    for npu_out, host in grown:
        _rebind(npu_out, host)
    if grown:
        args, kwargs = _restore(sig, args, kwargs, grown)
    return _results(sig, out, args, kwargs, views, index)


def _check_generators(call: "_Call") -> None:
    """torch's check that a random op's generator is of the op's device type (``check_generator``)."""
    for gen, _ in call.generators:
        if call.index is None and gen.device.type == "npu":
            raise RuntimeError("Expected a 'cpu' device type for generator but found 'npu'")
        if call.index is not None and gen.device.type != "npu":
            raise RuntimeError(f"Expected a 'npu' device type for generator but found '{gen.device.type}'")


class _Call:
    """One operator call's arguments made CPU ones: npu tensors as CPU views, npu devices as ``cpu``, npu
    generators as CPU generators in their state (written back after the call: hooks.cpp); notes the npu index, the
    first non-scalar CPU tensor, and which npu tensor each view shows."""
    __slots__ = ("cpu_seen", "generators", "grown", "index", "npu_tensor", "sig", "views")

    def __init__(self, sig: _Signature, grown) -> None:
        self.sig, self.grown = sig, grown
        self.index = None
        self.cpu_seen = None
        self.views = {}      # CPU view's storage (its StorageImpl, also for 0 bytes) -> the npu tensor it shows
        self.npu_tensor = False
        self.generators = []                         # (the caller's generator, the one the CPU kernel gets)
        for npu_out, _ in grown:                     # out= tensors the CPU kernel gets stand-ins for
            self._note_npu(npu_out.device)

    def _note_npu(self, dev: torch.device) -> None:
        self.npu_tensor = True
        if self.index is None:
            self.index = dev.index
        elif dev.index != self.index and not self.sig.cross_device:
            raise _same_device_error(f"npu:{self.index}", dev)

    def to_cpu(self, x):
        if isinstance(x, torch.Tensor):
            dev = x.device
            if dev.type == "npu":
                self._note_npu(dev)
                view = storage.cpu_view(x)
                self.views[view.untyped_storage()._cdata] = x
                return view
            if x.dim() and self.cpu_seen is None and not any(x is host for _, host in self.grown):
                self.cpu_seen = dev
            return x
        if isinstance(x, (list, tuple)):
            return type(x)(self.to_cpu(v) for v in x)
        if isinstance(x, torch.device) and x.type == "npu":
            if self.index is None:
                self.index = current_index() if x.index is None else x.index
            return _CPU
        if isinstance(x, torch.Generator):
            host = x
            if x.device.type == "npu":
                host = torch.Generator()
                host.set_state(x.get_state())
            self.generators.append((x, host))
            return host
        return x


def _empty_outs(sig: _Signature, args, kwargs):
    """``out=`` npu arguments as CPU tensors the CPU kernel may resize, as it resizes a CPU ``out=`` tensor of
    another shape: one without memory (made by ``empty({0})``, or of zero elements) as an empty CPU tensor, any
    other as its CPU view made resizable (``hooks.make_resizable``: growing moves the view to new CPU memory).
    Returns the (npu, CPU) pairs for :func:`_rebind`. Only ``out=`` arguments: an in-place op keeps ``self``'s
    shape even when it has no elements (``empty(8, 0).zero_()``)."""
    grown = []
    args, kwargs = list(args), dict(kwargs)
    for pos, name, kwarg_only in sig.outs:
        in_kwargs = kwarg_only or name in kwargs
        value = kwargs.get(name) if in_kwargs else (args[pos] if pos < len(args) else None)
        if isinstance(value, torch.Tensor) and value.device.type == "npu":
            if value.untyped_storage().nbytes():
                host = storage.cpu_view(value)
                if not hooks.make_resizable(host):
                    continue
            else:
                host = torch.empty((0,), dtype=value.dtype)
            grown.append((value, host))
            if in_kwargs:
                kwargs[name] = host
            else:
                args[pos] = host
    return tuple(args), kwargs, grown


def _restore(sig: _Signature, args, kwargs, grown):
    """The caller's npu tensors back in the places :func:`_empty_outs` lent CPU tensors."""
    back = {id(host): npu_out for npu_out, host in grown}
    args = tuple(back.get(id(a), a) if isinstance(a, torch.Tensor) else a for a in args)
    kwargs = {k: back.get(id(v), v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return args, kwargs


def _rebind(npu_out: torch.Tensor, host: torch.Tensor) -> None:
    """Give ``npu_out`` what the CPU kernel made of ``host``, its stand-in from :func:`_empty_outs`: the geometry,
    and the bytes if the kernel moved them to new memory — ``npu_out``'s storage is resized in place to hold them,
    as CPU torch resizes an ``out=`` storage, so the storage's other views see the new memory too."""
    store = npu_out.untyped_storage()
    fresh = host.untyped_storage()
    if fresh.data_ptr() != store.data_ptr():
        store.resize_(fresh.nbytes())
        storage.host_bytes(store).copy_(storage.host_bytes(fresh))
    elif (npu_out.shape == host.shape and npu_out.stride() == host.stride()
          and npu_out.storage_offset() == host.storage_offset()):
        return
    _set.redispatch(_CPU_KEYS, npu_out, store, host.storage_offset(), host.shape, host.stride())


def _results(sig: _Signature, out, args, kwargs, views: dict, index: int):
    single = not isinstance(out, tuple)
    outs = (out,) if single else out
    results = []
    for k, value in enumerate(outs):
        written = sig.written[k] if k < len(sig.written) else None
        if written is not None:
            pos, name, kwarg_only = written
            results.append(kwargs[name] if kwarg_only or name in kwargs else args[pos])
            continue
        results.append(_to_npu_all(value, views, index))
    return results[0] if single else tuple(results)


def _to_npu_all(value, views: dict, index: int):
    if isinstance(value, torch.Tensor):
        return _to_npu(value, views, index)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_npu_all(v, views, index) for v in value)
    return value


def _to_npu(x: torch.Tensor, views: dict, index: int) -> torch.Tensor:
    """A CPU result as an npu tensor: a view of an npu argument on that argument's storage, else adopted."""
    base = views.get(x.untyped_storage()._cdata)
    if base is not None:
        return storage.view_of(base, x)
    return storage.adopt(x, index)


def _host(t: torch.Tensor) -> torch.Tensor:
    return storage.cpu_view(t) if t.device.type == "npu" else t


def _copy_from(src, dst, non_blocking=False):
    """``dst.copy_(src)`` between devices (torch's ``copy_`` calls this when one side is npu)."""
    if dst.shape != src.shape and dst.numel() == 0:            # _copy_from_and_resize
        dst.resize_(src.shape)
    _host(dst).copy_(_host(src))
    return dst


def _resize(t, size, memory_format=None):
    """``resize_`` of an npu tensor: its storage grows in place (old bytes kept, ``hooks.cpp``) when the new size
    needs more bytes, as CPU torch's ``resize_`` does, so the tensor's views share the grown storage."""
    numel = 1
    for n in size:
        numel *= n
    nbytes = (t.storage_offset() + numel) * t.element_size() if numel else 0
    store = t.untyped_storage()
    if nbytes > store.nbytes():
        store.resize_(nbytes)
    fmt = torch.contiguous_format if memory_format is None else memory_format
    strides = torch.empty(size, dtype=t.dtype, device="meta").contiguous(memory_format=fmt).stride()
    return _set.redispatch(_CPU_KEYS, t, store, t.storage_offset(), size, strides)


def _convolution(*args):
    """``convolution_overrideable``: what torch's convolution calls for a device it has no kernel for."""
    return _fallback(torch.ops.aten.convolution.default, *args)


def _convolution_backward(grad_output, input, weight, stride, padding, dilation, transposed, output_padding,
                          groups, output_mask):
    """``convolution_backward_overrideable``, through torch's ``convolution_backward`` (which also wants the bias
    size: one per output channel)."""
    bias_sizes = [weight.shape[1] * groups if transposed else weight.shape[0]]
    return _fallback(torch.ops.aten.convolution_backward.default, grad_output, input, weight, bias_sizes, stride,
                     padding, dilation, transposed, output_padding, groups, output_mask)


_DENSE = ("cpu", "npu")


def _has_compatible_shallow_copy_type(self, other) -> bool:
    """Whether ``var.data = t`` may take ``t``'s tensor: torch_npu's rule, under which npu and CPU dense tensors
    are compatible both ways (torch's own counts PrivateUse1 as no dense backend; FSDP's ``offload_to_cpu`` moves
    a parameter's ``.data`` between the card and the host)."""
    if self.device.type == other.device.type:
        return self.layout == other.layout and self.is_quantized == other.is_quantized
    return (self.device.type in _DENSE and other.device.type in _DENSE and self.layout == other.layout == torch.strided
            and not self.is_quantized and not other.is_quantized)


def _tag(storage_obj):
    """torch.save's location of an npu storage (torch's own tagger says the same; this one is found first)."""
    dev = storage_obj.device
    return None if dev.type != "npu" else f"npu:{dev.index}"


def _deserialize(storage_obj, location: str):
    """torch.load onto an npu device (``map_location="npu:1"`` or a saved npu location): copies the loaded bytes
    into an npu tensor (torch's generic path would allocate through a C++ PrivateUse1 allocator, which a Python
    backend has not got)."""
    if not (location == "npu" or location.startswith("npu:")):
        return None
    device = torch.serialization._validate_device(location, "npu")
    index = current_index() if device.index is None else device.index
    nbytes = storage_obj.nbytes()
    host = torch.empty((0,), dtype=torch.uint8).set_(storage_obj, 0, (nbytes,), (1,))
    return host.to(torch.device("npu", index)).untyped_storage()


class Guard(torch._C._acc.DeviceGuard):
    """torch's Python device guard (one device, index 0), used only when ``device_guard.cpp`` cannot be built."""

    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


class Hooks(torch._C._acc.PrivateUse1Hooks):
    """torch's Python hooks, used only when ``hooks.cpp`` cannot be built (then no pinned memory, no npu
    generators)."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


def register(device_module) -> None:
    """Name PrivateUse1 ``npu``, register ``torch.npu`` and the fallback, add ``.npu()``/``.is_npu``."""
    global _library, _kernels
    if _library is not None:
        return
    device_guard.install()                   # first: torch keeps the first guard registered for PrivateUse1
    hooks.install()                          # and the first hooks (torch's Python ones lack pinned memory, generators)
    torch.utils.backend_registration._setup_privateuseone_for_python_backend(
        rename="npu", backend_module=device_module, hook=Hooks(), device_guard=Guard())
    torch.serialization.register_package(15, _tag, _deserialize)
    _library = torch.library.Library("_", "IMPL")
    _library.fallback(_fallback, "PrivateUse1")
    _kernels = torch.library.Library("aten", "IMPL")   # operators whose composite default would shadow the fallback
    _kernels.impl("convolution_overrideable", _convolution, "PrivateUse1")
    _kernels.impl("convolution_backward_overrideable", _convolution_backward, "PrivateUse1")
    _kernels.impl("_has_compatible_shallow_copy_type", _has_compatible_shallow_copy_type, "PrivateUse1")
    from . import accelerator_ops
    accelerator_ops.register(_kernels)
    for name in _structured_cpu_ops():
        op = _overload(name)
        _kernels.impl(name.split("::", 1)[1], functools.partial(_fallback, op), "PrivateUse1")


def _structured_cpu_ops() -> list:
    """Operators CPU torch runs with its own (structured) kernel but a backend without one runs through their
    ``CompositeExplicitAutogradNonFunctional`` default: that allocates the result in its final shape and calls the
    ``out=`` kernel, which TensorIterator first resizes to the unreduced shape (``mse_loss`` with
    ``reduction='mean'``: "An output with one or more elements was resized since it had shape []..."). npu tensors
    take the CPU's own path: the fallback with the functional operator (one call instead of ``empty`` + ``out=``)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return sorted(n for n in torch._C._dispatch_get_all_op_names()
                  if n.startswith("aten::") and has(n, "CompositeExplicitAutogradNonFunctional") and has(n, "CPU")
                  and not has(n, "PrivateUse1"))


def _overload(name: str):
    base, _, overload = name.split("::", 1)[1].partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")
