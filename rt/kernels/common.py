"""Shared helpers of the built-in kernels: dtype sets, error builders, attr parsing, shape algebra.

Every op module defines its ops through :func:`define`, which wraps the op's ``infer`` and
``compute`` with the checks every op needs (unknown attributes, input counts, output buffers that
do not match what ``infer`` says) so that the op bodies only hold the op's own logic.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ..constants import AclErrorCode
from ..dtypes import BFLOAT16
from ..errors import AclError
from .opdef import OpDef, TensorSpec, register

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
BF16 = BFLOAT16
FLOATS = (F16, BF16, F32, F64)
INTS = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8))
SIGNED_INTS = INTS[:4]
BOOL = (np.dtype(np.bool_),)
NUMERIC = FLOATS + INTS
ALL = NUMERIC + BOOL
INDEX = (np.dtype(np.int32), np.dtype(np.int64))

MAX_INPUTS = 1 << 16  # Concat's "N inputs": effectively unbounded, but still a finite check


# ---------------------------------------------------------------- errors

def invalid(op: str, message: str) -> AclError:
    """ACL_ERROR_INVALID_PARAM (100000) for a bad shape, attribute or index of ``op``."""
    return AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM, f"{op}: {message}")


def wrap_indices(op: str, indices: np.ndarray, dim: int, axis: int) -> np.ndarray:
    """``indices`` into an axis of size ``dim`` with negative ones counted from the end; an index outside
    ``[-dim, dim)`` is refused naming it, its position and the axis."""
    bad = (indices < -dim) | (indices >= dim)
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        raise invalid(op, f"index {int(indices[pos])} at position {pos} of indices is out of range for axis {axis} "
                          f"of size {dim} (expected {-dim} <= index < {dim})")
    return np.where(indices < 0, indices + dim, indices)


def unsupported(op: str, message: str) -> AclError:
    """ACL_ERROR_UNSUPPORTED_DATA_TYPE (100026) for a dtype ``op`` cannot take."""
    return AclError(AclErrorCode.ACL_ERROR_UNSUPPORTED_DATA_TYPE, f"{op}: {message}")


def _names(dtypes: Iterable[np.dtype]) -> str:
    return ", ".join(str(d) for d in dtypes)


def check_dtype(op: str, arg: str, spec: TensorSpec, allowed: Sequence[np.dtype]) -> None:
    """Reject ``spec`` unless its dtype is one of ``allowed``."""
    if spec.dtype not in allowed:
        raise unsupported(op, f"{arg} has dtype {spec.dtype}, expected one of: {_names(allowed)}")


def same_dtype(op: str, named: Sequence[tuple[str, TensorSpec]]) -> np.dtype:
    """All named specs must share one dtype (no silent promotion); returns it."""
    first_name, first = named[0]
    for name, spec in named[1:]:
        if spec.dtype != first.dtype:
            raise unsupported(op, f"{first_name} is {first.dtype} but {name} is {spec.dtype} "
                                  f"(inputs must share one dtype; cast one of them first)")
    return first.dtype


# ---------------------------------------------------------------- attributes

_REQUIRED = object()


def _get(op: str, attrs: dict, name: str, default):
    if name in attrs and attrs[name] is not None:
        return attrs[name]
    if default is _REQUIRED:
        raise invalid(op, f"attribute {name!r} is required")
    return default


def attr_int(op: str, attrs: dict, name: str, default=_REQUIRED) -> int | None:
    """An integer attribute (bools count as 0/1, as in ONNX's INT attributes); None if absent and
    the default is None."""
    value = _get(op, attrs, name, default)
    if value is None:
        return None
    if not isinstance(value, (int, np.integer)):
        raise invalid(op, f"attribute {name}={value!r} must be an int")
    return int(value)


def attr_bool(op: str, attrs: dict, name: str, default=_REQUIRED) -> bool:
    value = _get(op, attrs, name, default)
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise invalid(op, f"attribute {name}={value!r} must be a bool (or 0/1)")


def attr_float(op: str, attrs: dict, name: str, default=_REQUIRED) -> float:
    value = _get(op, attrs, name, default)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise invalid(op, f"attribute {name}={value!r} must be a number")
    return float(value)


def attr_str(op: str, attrs: dict, name: str, default, choices: Sequence[str]) -> str:
    value = _get(op, attrs, name, default)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if value not in choices:
        raise invalid(op, f"attribute {name}={value!r} must be one of {', '.join(map(repr, choices))}")
    return value


def attr_ints(op: str, attrs: dict, name: str, default=_REQUIRED) -> list[int] | None:
    """A list-of-ints attribute; ``None`` when absent and the default is None."""
    value = _get(op, attrs, name, default)
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        raise invalid(op, f"attribute {name}={value!r} must be a list of ints")
    return [int(v) for v in value]


def norm_axis(op: str, axis: int, rank: int, what: str = "axis") -> int:
    """Map an axis in [-rank, rank-1] to [0, rank-1]."""
    if not -rank <= axis < rank:
        raise invalid(op, f"{what} {axis} is out of range for rank {rank} (expected {-rank} <= {what} < {rank})")
    return axis + rank if axis < 0 else axis


def norm_axes(op: str, axes: Sequence[int], rank: int, what: str = "axes") -> list[int]:
    """Normalize a list of axes, rejecting out-of-range and repeated ones."""
    out = [norm_axis(op, a, rank, what) for a in axes]
    if len(set(out)) != len(out):
        raise invalid(op, f"{what} {list(axes)} repeats an axis (rank {rank})")
    return out


# ---------------------------------------------------------------- shapes (with -1 = dynamic)

def broadcast(op: str, named: Sequence[tuple[str, tuple[int, ...]]]) -> tuple[int, ...]:
    """numpy multidirectional broadcasting of several shapes; -1 dims stay unknown unless forced."""
    rank = max(len(shape) for _, shape in named)
    out = []
    for i in range(rank):
        dim = 1
        for _, shape in named:
            d = shape[i - rank + len(shape)] if i - rank + len(shape) >= 0 else 1
            dim = _merge_broadcast_dim(op, named, dim, d)
        out.append(dim)
    return tuple(out)


def _merge_broadcast_dim(op, named, a: int, b: int) -> int:
    if a == 1:
        return b
    if b == 1 or a == b:
        return a
    if a == -1:  # unknown vs a known k != 1: the unknown one must be k (or 1), result is k
        return b
    if b == -1:
        return a
    shapes = ", ".join(f"{name} is {tuple(shape)}" for name, shape in named)
    raise invalid(op, f"shapes do not broadcast: {shapes} (dims {a} and {b} differ and neither is 1)")


def broadcasts_to(op: str, name: str, shape: tuple[int, ...], target: tuple[int, ...], target_name: str) -> None:
    """Unidirectional broadcasting: ``shape`` must stretch to ``target`` without changing it."""
    ok = len(shape) <= len(target) and all(
        s in (1, -1) or t == -1 or s == t for s, t in zip(reversed(shape), reversed(target)))
    if not ok:
        raise invalid(op, f"{name} of shape {tuple(shape)} does not broadcast to {target_name} {tuple(target)} "
                          f"(expected each trailing dim of {name} to be 1 or equal)")


def merge_shapes(op: str, named: Sequence[tuple[str, tuple[int, ...]]]) -> tuple[int, ...]:
    """Shapes that must be identical; -1 dims are filled from the others."""
    first_name, first = named[0]
    out = list(first)
    for name, shape in named[1:]:
        if len(shape) != len(out):
            raise invalid(op, f"{name} has shape {tuple(shape)} but {first_name} has {tuple(first)} "
                              f"(expected the same shape)")
        for i, d in enumerate(shape):
            if out[i] == -1:
                out[i] = d
            elif d != -1 and d != out[i]:
                raise invalid(op, f"{name} has shape {tuple(shape)} but {first_name} has {tuple(first)} "
                                  f"(expected the same shape)")
    return tuple(out)


def known(*dims: int) -> bool:
    return all(d >= 0 for d in dims)


# ---------------------------------------------------------------- compute helpers

def wide(a: np.ndarray) -> np.ndarray:
    """fp16/bf16 data as float32 for the math (NPUs accumulate in fp32); other dtypes unchanged."""
    return a.astype(F32) if a.dtype in (F16, BF16) else a


_erf_scalar = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """Elementwise erf to double precision (numpy has none; scipy is a heavy import for a card)."""
    return _erf_scalar(np.asarray(x, dtype=F64)).astype(F64)


def sum_to_shape(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Reverse of broadcasting: sum ``a`` down to ``shape`` (for gradients of broadcast inputs)."""
    lead = a.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and a.shape[lead + i] != 1)
    return a.sum(axis=axes, keepdims=True).reshape(shape) if axes else a.reshape(shape)


# ---------------------------------------------------------------- definition

def define(name: str, snake: str, infer: Callable, compute: Callable, *, attrs: Sequence[str] = (),
           min_inputs: int = 1, max_inputs: int | None = None, inplace: tuple[int, ...] = (),
           doc: str = "") -> OpDef:
    """Register an op whose infer/compute are wrapped with the shared checks."""
    max_inputs = min_inputs if max_inputs is None else max_inputs
    known_attrs = frozenset(attrs)

    def check_attrs(attr_dict: dict) -> dict:
        attr_dict = dict(attr_dict or {})
        unknown = sorted(set(attr_dict) - known_attrs)
        if unknown:
            expected = ", ".join(sorted(known_attrs)) or "none"
            raise invalid(name, f"unknown attribute(s) {', '.join(unknown)} (expected: {expected})")
        return attr_dict

    def check_count(n: int) -> None:  # as registry.infer does, for callers that skip it
        if not min_inputs <= n <= max_inputs:
            raise AclError(AclErrorCode.ACL_ERROR_OP_INPUT_NOT_MATCH,
                           f"{name}: got {n} inputs, expected {min_inputs}..{max_inputs}")

    def checked_infer(specs: list[TensorSpec], attr_dict: dict) -> list[TensorSpec]:
        check_count(len(specs))
        return infer(list(specs), check_attrs(attr_dict))

    def checked_compute(inputs: list[np.ndarray], outputs: list[np.ndarray], attr_dict: dict) -> None:
        check_count(len(inputs))
        attr_dict = check_attrs(attr_dict)
        # Outputs were allocated from infer on the host; a launch with other buffers (a user's out=,
        # a stale model) must fail cleanly here rather than as a numpy broadcast error.
        expected = infer([TensorSpec(a.shape, a.dtype) for a in inputs], attr_dict)
        if len(outputs) != len(expected):
            raise AclError(AclErrorCode.ACL_ERROR_OP_OUTPUT_NOT_MATCH,
                           f"{name}: got {len(outputs)} outputs, expected {len(expected)}")
        for i, (arr, spec) in enumerate(zip(outputs, expected)):
            if tuple(arr.shape) != spec.shape or arr.dtype != spec.dtype:
                raise invalid(name, f"output {i} is {tuple(arr.shape)} {arr.dtype}, "
                                    f"expected {spec.shape} {spec.dtype}")
        with np.errstate(all="ignore"):  # like the hardware: inf/nan results, no warnings
            compute(inputs, outputs, attr_dict)

    checked_infer.__doc__ = infer.__doc__
    checked_compute.__doc__ = compute.__doc__
    return register(OpDef(name=name, snake=snake, infer=checked_infer, compute=checked_compute,
                          min_inputs=min_inputs, max_inputs=max_inputs, inplace=inplace,
                          doc=doc or inspect.cleandoc(compute.__doc__ or "")))
