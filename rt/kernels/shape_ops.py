"""Data-movement ops: Reshape, Transpose, Concat, Split, Slice, Gather (ONNX semantics).

Shapes and indices are attributes here (ONNX passes some as tensors) so that shape inference can
run on the host before launch. Every dtype the library knows is accepted.
"""

from __future__ import annotations

import math

import numpy as np

from .common import (ALL, INDEX, MAX_INPUTS, attr_int, attr_ints, check_dtype, define, invalid, known,
                     norm_axes, norm_axis, same_dtype, wrap_indices)
from .opdef import TensorSpec


# ---------------------------------------------------------------- Reshape

def reshape_target(op: str, in_shape: tuple[int, ...], shape: list[int], allowzero: bool) -> tuple[int, ...]:
    """ONNX Reshape: 0 copies the input dim (unless allowzero), one -1 takes what is left."""
    if shape.count(-1) > 1:
        raise invalid(op, f"shape {shape} has more than one -1")
    if any(d < -1 for d in shape):
        raise invalid(op, f"shape {shape} has a negative dim other than -1")
    if allowzero and 0 in shape and -1 in shape:
        raise invalid(op, f"shape {shape} mixes 0 and -1 with allowzero=1 (the -1 is ambiguous)")
    out = []
    for i, d in enumerate(shape):
        if d == 0 and not allowzero:
            if i >= len(in_shape):
                raise invalid(op, f"shape {shape} copies dim {i} (a 0) but the input {in_shape} has rank "
                                  f"{len(in_shape)}")
            d = in_shape[i]
        out.append(d)
    # `out` may hold -1 from the attribute (to infer) or from a dynamic input dim (unknown).
    infer_at = shape.index(-1) if -1 in shape else None
    fixed = [d for i, d in enumerate(out) if i != infer_at]
    total = math.prod(in_shape)
    if not known(*in_shape) or not known(*fixed):
        return tuple(out)  # something is dynamic: only the run-time shapes can be checked
    prod = math.prod(fixed)
    if infer_at is not None:
        if prod == 0 or total % prod:
            raise invalid(op, f"cannot reshape {in_shape} ({total} elements) to {shape}: "
                              f"{total} is not a multiple of {prod}")
        out[infer_at] = total // prod
    elif prod != total:
        raise invalid(op, f"cannot reshape {in_shape} ({total} elements) to {shape} ({prod} elements)")
    return tuple(out)


def _reshape_infer(specs, attrs):
    (x,) = specs
    check_dtype("Reshape", "data", x, ALL)
    shape = attr_ints("Reshape", attrs, "shape")
    allowzero = attr_int("Reshape", attrs, "allowzero", 0)
    return [TensorSpec(reshape_target("Reshape", x.shape, shape, bool(allowzero)), x.dtype)]


def _reshape_compute(inputs, outputs, attrs):
    """reshaped = data with shape ``shape`` (0 copies a dim unless allowzero=1, -1 is inferred)."""
    outputs[0][...] = inputs[0].reshape(outputs[0].shape)


define("Reshape", "reshape", _reshape_infer, _reshape_compute, attrs=("shape", "allowzero"))


# ---------------------------------------------------------------- Transpose

def _perm(attrs: dict, rank: int) -> list[int]:
    perm = attr_ints("Transpose", attrs, "perm", None)
    if perm is None:
        return list(range(rank))[::-1]
    if sorted(perm) != list(range(rank)):
        raise invalid("Transpose", f"perm {perm} is not a permutation of 0..{rank - 1} (input rank {rank})")
    return perm


def _transpose_infer(specs, attrs):
    (x,) = specs
    check_dtype("Transpose", "data", x, ALL)
    return [TensorSpec(tuple(x.shape[p] for p in _perm(attrs, len(x.shape))), x.dtype)]


def _transpose_compute(inputs, outputs, attrs):
    """transposed = data with its axes permuted by ``perm`` (default: reversed)."""
    outputs[0][...] = np.transpose(inputs[0], _perm(attrs, inputs[0].ndim))


define("Transpose", "transpose", _transpose_infer, _transpose_compute, attrs=("perm",))


# ---------------------------------------------------------------- Concat

def _concat_infer(specs, attrs):
    check_dtype("Concat", "inputs[0]", specs[0], ALL)
    dtype = same_dtype("Concat", [(f"inputs[{i}]", s) for i, s in enumerate(specs)])
    rank = len(specs[0].shape)
    if rank == 0:
        raise invalid("Concat", "inputs[0] is a scalar (expected rank >= 1)")
    axis = norm_axis("Concat", attr_int("Concat", attrs, "axis"), rank)
    out = list(specs[0].shape)
    for i, spec in enumerate(specs[1:], start=1):
        if len(spec.shape) != rank:
            raise invalid("Concat", f"inputs[{i}] has rank {len(spec.shape)} ({spec.shape}) but inputs[0] has "
                                    f"rank {rank} ({specs[0].shape})")
        for d, (have, new) in enumerate(zip(out, spec.shape)):
            if d == axis:
                out[d] = have + new if known(have, new) else -1
            elif have == -1:
                out[d] = new
            elif new not in (-1, have):
                raise invalid("Concat", f"inputs[{i}] has shape {spec.shape} but inputs[0] has "
                                        f"{specs[0].shape} (expected equal dims except on axis {axis})")
    return [TensorSpec(tuple(out), dtype)]


def _concat_compute(inputs, outputs, attrs):
    """concat_result = the inputs joined along ``axis``."""
    axis = norm_axis("Concat", attr_int("Concat", attrs, "axis"), inputs[0].ndim)
    np.concatenate(inputs, axis=axis, out=outputs[0])


define("Concat", "concat", _concat_infer, _concat_compute, attrs=("axis",), max_inputs=MAX_INPUTS)


# ---------------------------------------------------------------- Split

def split_sizes(attrs: dict, dim: int) -> list[int]:
    """Chunk sizes along the split axis: ``split`` as given, or ``num_outputs`` ONNX-18 chunks."""
    split = attr_ints("Split", attrs, "split", None)
    num = attr_int("Split", attrs, "num_outputs", None)
    if (split is None) == (num is None):
        raise invalid("Split", "give exactly one of the attributes 'split' (chunk sizes) and 'num_outputs'")
    if split is not None:
        if not split or any(s < 0 for s in split):
            raise invalid("Split", f"split {split} must be a non-empty list of sizes >= 0")
        if dim >= 0 and sum(split) != dim:
            raise invalid("Split", f"split {split} sums to {sum(split)} but the axis has size {dim}")
        return split
    if num < 1:
        raise invalid("Split", f"num_outputs={num} (expected >= 1)")
    if dim < 0:
        return [-1] * num
    chunk = -(-dim // num)  # ONNX: chunks of ceil(dim / n), the last one smaller
    last = dim - chunk * (num - 1)
    if last < 1 and num > 1:
        raise invalid("Split", f"num_outputs={num} does not fit an axis of size {dim} "
                               f"(chunks of {chunk} leave {max(last, 0)} for the last output)")
    return [chunk] * (num - 1) + [last]


def _split_infer(specs, attrs):
    (x,) = specs
    check_dtype("Split", "input", x, ALL)
    axis = norm_axis("Split", attr_int("Split", attrs, "axis", 0), len(x.shape))
    sizes = split_sizes(attrs, x.shape[axis])
    return [TensorSpec(x.shape[:axis] + (s,) + x.shape[axis + 1:], x.dtype) for s in sizes]


def _split_compute(inputs, outputs, attrs):
    """outputs = consecutive chunks of input along ``axis`` (sizes from ``split`` or ``num_outputs``)."""
    x = inputs[0]
    axis = norm_axis("Split", attr_int("Split", attrs, "axis", 0), x.ndim)
    index = [slice(None)] * x.ndim
    start = 0
    for out in outputs:
        size = out.shape[axis]
        index[axis] = slice(start, start + size)
        out[...] = x[tuple(index)]
        start += size


define("Split", "split", _split_infer, _split_compute, attrs=("axis", "split", "num_outputs"))


# ---------------------------------------------------------------- Slice

def slice_params(attrs: dict, shape: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
    """(axis, start, end, step) per sliced axis after ONNX clamping; start/end are -1 for dynamic dims."""
    starts, ends = attr_ints("Slice", attrs, "starts"), attr_ints("Slice", attrs, "ends")
    axes = attr_ints("Slice", attrs, "axes", None)
    steps = attr_ints("Slice", attrs, "steps", None)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise invalid("Slice", f"starts {starts}, ends {ends}, axes {axes}, steps {steps} "
                               f"(expected lists of equal length)")
    if 0 in steps:
        raise invalid("Slice", f"steps {steps} contain 0 (expected non-zero steps)")
    axes = norm_axes("Slice", axes, len(shape))
    params = []
    for axis, start, end, step in zip(axes, starts, ends, steps):
        dim = shape[axis]
        if dim < 0:
            params.append((axis, -1, -1, step))
            continue
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        params.append((axis, start, end, step))
    return params


def _slice_len(start: int, end: int, step: int) -> int:
    return max(0, -(-(end - start) // step))


def _slice_infer(specs, attrs):
    (x,) = specs
    check_dtype("Slice", "data", x, ALL)
    out = list(x.shape)
    for axis, start, end, step in slice_params(attrs, x.shape):
        out[axis] = -1 if x.shape[axis] < 0 else _slice_len(start, end, step)
    return [TensorSpec(tuple(out), x.dtype)]


def _slice_compute(inputs, outputs, attrs):
    """output = data[starts:ends:steps] on ``axes``, with ONNX's clamping of out-of-range bounds."""
    x = inputs[0]
    index = [slice(None)] * x.ndim
    for axis, start, end, step in slice_params(attrs, x.shape):
        if _slice_len(start, end, step) == 0:
            index[axis] = slice(0, 0)
        else:  # after clamping, end == -1 means "through index 0" for a negative step
            index[axis] = slice(start, end if end >= 0 else None, step)
    outputs[0][...] = x[tuple(index)]


define("Slice", "slice", _slice_infer, _slice_compute, attrs=("starts", "ends", "axes", "steps"))


# ---------------------------------------------------------------- Gather

def _gather_infer(specs, attrs):
    data, indices = specs
    check_dtype("Gather", "data", data, ALL)
    check_dtype("Gather", "indices", indices, INDEX)
    if not data.shape:
        raise invalid("Gather", "data is a scalar (expected rank >= 1)")
    axis = norm_axis("Gather", attr_int("Gather", attrs, "axis", 0), len(data.shape))
    return [TensorSpec(data.shape[:axis] + indices.shape + data.shape[axis + 1:], data.dtype)]


def _gather_compute(inputs, outputs, attrs):
    """output = data indexed along ``axis`` by ``indices`` (negative indices count from the end)."""
    data, indices = inputs
    axis = norm_axis("Gather", attr_int("Gather", attrs, "axis", 0), data.ndim)
    np.take(data, wrap_indices("Gather", indices, data.shape[axis], axis), axis=axis, out=outputs[0])


define("Gather", "gather", _gather_infer, _gather_compute, attrs=("axis",), min_inputs=2)
