"""Eager built-in ops on the current card: ``rt.ops.matmul(a, b)``, ``rt.ops.softmax(x, axis=1)``, ...

One function per registered op, named by its snake_case name and generated from the kernel
registry, with the signature ``fn(*inputs, stream=None, out=None, **attrs)``:

- ``inputs`` are ``rt.Tensor``s on the current card; ``attrs`` are the op's ONNX attributes;
- shapes and dtypes are checked on the host (``registry.infer``) before anything is launched;
- outputs are allocated with ``rt.empty`` (or taken from ``out=[...]``), the kernel is enqueued
  on ``stream`` (default stream if None) and the call returns without waiting;
- the result is one ``rt.Tensor``, a tuple of them for multi-output ops (``split``,
  ``layer_normalization``, ...), or None for in-place ops (``sgd_momentum``, ``adam``).

Kernel failures at run time (an out-of-range ``gather`` index, say) surface at the next
synchronize that covers the stream, as for any queued work.
"""

from __future__ import annotations

import numpy as np

from .. import args
from ..constants import AclErrorCode
from ..errors import AclError
from ..kernels.registry import BY_SNAKE, OpDef, TensorSpec, infer
from .tensor import empty, launch_kernel


def _wire_attr(value):
    """Attribute values as msgpack can carry them: numpy scalars/arrays and dtypes to plain Python."""
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, (np.generic, bool, int, float))):
        return np.dtype(value).name  # Cast(to=np.float16) travels as "float16"
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, list):
        return [_wire_attr(v) for v in value]
    return value


def _spec(opdef: OpDef, t, what: str) -> TensorSpec:
    """The TensorSpec of a tensor argument (anything with ``shape`` and ``dtype``, as rt.Tensor)."""
    try:
        return TensorSpec(tuple(t.shape), t.dtype)
    except (AttributeError, TypeError, ValueError):
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM,
                       f"{opdef.snake}: {what} is {args.shown(t)}, expected an rt.Tensor") from None


def _check_out(opdef: OpDef, out, specs: list[TensorSpec]) -> list:
    if not isinstance(out, (list, tuple)):
        out = [out]
    for i, t in enumerate(out):
        _spec(opdef, t, f"out[{i}]")
    out = list(out)
    if len(out) != len(specs):
        raise AclError(AclErrorCode.ACL_ERROR_OP_OUTPUT_NOT_MATCH,
                       f"{opdef.snake}: out= has {len(out)} tensors, expected {len(specs)}")
    for i, (tensor, spec) in enumerate(zip(out, specs)):
        if tuple(tensor.shape) != spec.shape or np.dtype(tensor.dtype) != spec.dtype:
            raise AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM,
                           f"{opdef.snake}: out[{i}] is {tuple(tensor.shape)} {np.dtype(tensor.dtype)}, "
                           f"expected {spec.shape} {spec.dtype}")
    return out


def _make(opdef: OpDef):
    def op(*inputs, stream=None, out=None, **attrs):
        attrs = {k: _wire_attr(v) for k, v in attrs.items()}
        specs = [_spec(opdef, t, f"input {i}") for i, t in enumerate(inputs)]
        out_specs = infer(opdef.name, specs, attrs)
        if out is not None:
            outputs = _check_out(opdef, out, out_specs)
        else:
            outputs = [empty(s.shape, s.dtype) for s in out_specs]
        launch_kernel(opdef.name, list(inputs), outputs, attrs, stream=stream)
        if not outputs:
            return None
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    op.__name__ = op.__qualname__ = opdef.snake
    op.__module__ = __name__
    inplace = (f"\n\nUpdates inputs {list(opdef.inplace)} in place and returns None." if opdef.inplace else "")
    op.__doc__ = (f"{opdef.name} (ONNX): {opdef.doc}{inplace}\n\n"
                  f"Call as ``rt.ops.{opdef.snake}(*inputs, stream=None, out=None, **attrs)`` with "
                  f"{opdef.min_inputs}..{opdef.max_inputs} input tensors.")
    return op


__all__ = sorted(BY_SNAKE)
globals().update({snake: _make(opdef) for snake, opdef in BY_SNAKE.items()})
