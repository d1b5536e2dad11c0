"""Shape-changing ops of exported models (ONNX semantics): Flatten, Squeeze, Unsqueeze, Expand,
Tile, Pad, and the masking Trilu.

As for Reshape and Slice, the tensors ONNX passes as inputs to fix a shape are attributes of the
same name here (Squeeze/Unsqueeze ``axes``, Expand ``shape``, Tile ``repeats``, Pad ``pads``,
``constant_value`` and ``axes``, Trilu ``k``), so that shapes are known on the host before launch.
Every dtype the library knows is accepted.
"""

from __future__ import annotations

import math

import numpy as np

from .common import (
    ALL,
    attr_float,
    attr_int,
    attr_ints,
    attr_str,
    broadcast,
    check_dtype,
    define,
    invalid,
    known,
    norm_axes,
)
from .opdef import TensorSpec

# ---------------------------------------------------------------- Flatten

def _flatten_infer(specs, attrs):
    (x,) = specs
    check_dtype("Flatten", "input", x, ALL)
    rank = len(x.shape)
    axis = attr_int("Flatten", attrs, "axis", 1)
    if not -rank <= axis <= rank:
        raise invalid("Flatten", f"axis {axis} is out of range for rank {rank} (expected {-rank} <= axis <= {rank})")
    axis = axis + rank if axis < 0 else axis
    outer, inner = x.shape[:axis], x.shape[axis:]
    return [TensorSpec((math.prod(outer) if known(*outer) else -1, math.prod(inner) if known(*inner) else -1),
                       x.dtype)]


def _flatten_compute(inputs, outputs, attrs):
    """output = input as a 2-D matrix: dims before ``axis`` (default 1) times the dims from it."""
    outputs[0][...] = inputs[0].reshape(outputs[0].shape)


define("Flatten", "flatten", _flatten_infer, _flatten_compute, attrs=("axis",))


# ---------------------------------------------------------------- Squeeze / Unsqueeze

def _squeeze_shape(shape: tuple[int, ...], attrs: dict) -> tuple[int, ...]:
    axes = attr_ints("Squeeze", attrs, "axes", None)
    if axes is None:
        if -1 in shape:
            raise invalid("Squeeze", f"data has dynamic shape {shape} and no axes are given (which dims are 1 "
                                     f"is unknown until run time; give axes)")
        return tuple(d for d in shape if d != 1)
    axes = norm_axes("Squeeze", axes, len(shape))
    for a in axes:
        if shape[a] not in (1, -1):
            raise invalid("Squeeze", f"axis {a} of data {shape} has size {shape[a]} (expected 1 on every "
                                     f"squeezed axis)")
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _squeeze_infer(specs, attrs):
    (x,) = specs
    check_dtype("Squeeze", "data", x, ALL)
    return [TensorSpec(_squeeze_shape(x.shape, attrs), x.dtype)]


def _unsqueeze_shape(shape: tuple[int, ...], attrs: dict) -> tuple[int, ...]:
    axes = attr_ints("Unsqueeze", attrs, "axes")
    rank = len(shape) + len(axes)
    axes = norm_axes("Unsqueeze", axes, rank)
    dims = iter(shape)
    return tuple(1 if i in axes else next(dims) for i in range(rank))


def _unsqueeze_infer(specs, attrs):
    (x,) = specs
    check_dtype("Unsqueeze", "data", x, ALL)
    return [TensorSpec(_unsqueeze_shape(x.shape, attrs), x.dtype)]


def _reshape_compute(inputs, outputs, attrs):
    outputs[0][...] = inputs[0].reshape(outputs[0].shape)


def _as(doc: str):
    def compute(inputs, outputs, attrs):
        _reshape_compute(inputs, outputs, attrs)
    compute.__doc__ = doc
    return compute


define("Squeeze", "squeeze", _squeeze_infer,
       _as("squeezed = data without the size-1 dims listed in ``axes`` (all size-1 dims if absent)."),
       attrs=("axes",))
define("Unsqueeze", "unsqueeze", _unsqueeze_infer,
       _as("expanded = data with size-1 dims inserted at ``axes`` (positions in the output)."), attrs=("axes",))


# ---------------------------------------------------------------- Expand / Tile

def _expand_infer(specs, attrs):
    (x,) = specs
    check_dtype("Expand", "input", x, ALL)
    shape = attr_ints("Expand", attrs, "shape")
    if any(d < 0 for d in shape):
        raise invalid("Expand", f"shape {shape} has a negative dim")
    return [TensorSpec(broadcast("Expand", [("input", x.shape), ("shape", tuple(shape))]), x.dtype)]


def _expand_compute(inputs, outputs, attrs):
    """output = input broadcast with ``shape`` (numpy's two-way broadcasting: a 1 in ``shape`` keeps the
    input's dim)."""
    outputs[0][...] = np.broadcast_to(inputs[0], outputs[0].shape)


define("Expand", "expand", _expand_infer, _expand_compute, attrs=("shape",))


def _tile_infer(specs, attrs):
    (x,) = specs
    check_dtype("Tile", "input", x, ALL)
    repeats = attr_ints("Tile", attrs, "repeats")
    if len(repeats) != len(x.shape) or any(r < 0 for r in repeats):
        raise invalid("Tile", f"repeats {repeats} (expected {len(x.shape)} values >= 0, one per dim of input "
                              f"{x.shape})")
    return [TensorSpec(tuple(d * r if d >= 0 else -1 for d, r in zip(x.shape, repeats)), x.dtype)]


def _tile_compute(inputs, outputs, attrs):
    """output = input repeated ``repeats[i]`` times along each dim i."""
    outputs[0][...] = np.tile(inputs[0], attr_ints("Tile", attrs, "repeats"))


define("Tile", "tile", _tile_infer, _tile_compute, attrs=("repeats",))


# ---------------------------------------------------------------- Pad

PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_widths(shape: tuple[int, ...], attrs: dict) -> list[tuple[int, int]]:
    """(before, after) per dim of the input; negative values remove elements."""
    rank = len(shape)
    pads = attr_ints("Pad", attrs, "pads")
    axes = attr_ints("Pad", attrs, "axes", None)
    axes = list(range(rank)) if axes is None else norm_axes("Pad", axes, rank)
    if len(pads) != 2 * len(axes):
        raise invalid("Pad", f"pads {pads} has {len(pads)} values (expected {2 * len(axes)}: begins then ends "
                             f"of axes {axes})")
    widths = [(0, 0)] * rank
    for i, a in enumerate(axes):
        widths[a] = (pads[i], pads[len(axes) + i])
        if shape[a] >= 0 and shape[a] + pads[i] + pads[len(axes) + i] < 0:
            raise invalid("Pad", f"pads {pads} remove more than the {shape[a]} elements of axis {a}")
    return widths


def _pad_value(dtype: np.dtype, attrs: dict):
    key = "value" if attrs.get("value") is not None else "constant_value"  # opset < 11 calls it value
    value = attr_float("Pad", attrs, key, 0.0)
    if dtype.kind in "iub" and not value.is_integer():
        raise invalid("Pad", f"{key}={value} is not an integer but data is {dtype}")
    return value


def _pad_infer(specs, attrs):
    (x,) = specs
    check_dtype("Pad", "data", x, ALL)
    mode = attr_str("Pad", attrs, "mode", "constant", PAD_MODES)
    _pad_value(x.dtype, attrs)
    widths = _pad_widths(x.shape, attrs)
    for axis, ((b, e), d) in enumerate(zip(widths, x.shape)):
        if mode == "reflect" and d >= 0 and max(b, e) >= d:
            raise invalid("Pad", f"mode 'reflect' pads axis {axis} of size {d} by ({b}, {e}) (expected pads "
                                 f"smaller than the axis size)")
        if mode in ("edge", "wrap") and d == 0 and (b > 0 or e > 0):
            raise invalid("Pad", f"mode {mode!r} pads axis {axis}, which is empty")
    return [TensorSpec(tuple(d + b + e if d >= 0 else -1 for d, (b, e) in zip(x.shape, widths)), x.dtype)]


def _pad_compute(inputs, outputs, attrs):
    """output = data padded by ``pads`` (begins then ends of ``axes``, default all) with ``mode``:
    'constant' (``constant_value``), 'reflect' (mirror without the edge), 'edge' (repeat the edge) or
    'wrap'; a negative pad removes elements from that side first."""
    x = inputs[0]
    widths = _pad_widths(x.shape, attrs)
    crop = tuple(slice(max(-b, 0), d - max(-e, 0)) for d, (b, e) in zip(x.shape, widths))
    x = x[crop]
    grow = [(max(b, 0), max(e, 0)) for b, e in widths]
    mode = attr_str("Pad", attrs, "mode", "constant", PAD_MODES)
    if mode == "constant":
        outputs[0][...] = np.pad(x, grow, mode="constant", constant_values=_pad_value(x.dtype, attrs))
    else:
        outputs[0][...] = np.pad(x, grow, mode=mode)


define("Pad", "pad", _pad_infer, _pad_compute, attrs=("pads", "constant_value", "value", "axes", "mode"))


# ---------------------------------------------------------------- Trilu

def _trilu_infer(specs, attrs):
    (x,) = specs
    check_dtype("Trilu", "input", x, ALL)
    if len(x.shape) < 2:
        raise invalid("Trilu", f"input has shape {x.shape} (expected rank >= 2: a batch of matrices)")
    attr_int("Trilu", attrs, "k", 0)
    attr_int("Trilu", attrs, "upper", 1)
    return [TensorSpec(x.shape, x.dtype)]


def _trilu_compute(inputs, outputs, attrs):
    """output = the upper (upper=1: elements on and above diagonal ``k``) or lower (upper=0: on and
    below it) triangle of each matrix of the last two dims, zeros elsewhere. ``k`` is an attribute here
    (ONNX's optional input)."""
    x = inputs[0]
    k = attr_int("Trilu", attrs, "k", 0)
    keep = np.triu(np.ones(x.shape[-2:], bool), k) if attr_int("Trilu", attrs, "upper", 1) else \
        np.tril(np.ones(x.shape[-2:], bool), k)
    outputs[0][...] = np.where(keep, x, np.zeros((), x.dtype))


define("Trilu", "trilu", _trilu_infer, _trilu_compute, attrs=("k", "upper"))
