"""Resize (ONNX opset 11–19 semantics) for ``mode`` 'nearest' and 'linear' (n-linear).

``scales`` or ``sizes`` (exactly one; attributes here, inputs in ONNX) gives the output size per
axis of ``axes`` (default all): ``floor(in · scale)``, or ``sizes`` with scale ``out / in`` (and
``keep_aspect_ratio_policy`` 'not_larger'/'not_smaller' taking one scale for all axes, sizes
``round(in · scale)``). Each output coordinate maps back to the input by
``coordinate_transformation_mode``: 'half_pixel' (default) ``(x + 0.5) / scale - 0.5``;
'half_pixel_symmetric' the same, centred; 'pytorch_half_pixel' the same, 0 for an output of length
1; 'align_corners' ``x · (in - 1) / (out - 1)``; 'asymmetric' ``x / scale``; 'tf_half_pixel_for_nn'
``(x + 0.5) / scale``. Nearest rounds that by ``nearest_mode`` ('round_prefer_floor' (default),
'round_prefer_ceil', 'floor', 'ceil'); linear interpolates the two neighbours; both clamp to the
input. The interpolation is separable: one axis at a time, each a gather plus a weighted sum.
Not supported (refused naming the value): 'cubic', 'tf_crop_and_resize', ``antialias=1``, a
non-empty ``roi``. Upsample (opset 7–9) is Resize with 'asymmetric' coordinates and 'floor'
nearest rounding.
"""

from __future__ import annotations

import math

import numpy as np

from .common import (
    F64,
    FLOATS,
    NUMERIC,
    attr_float,
    attr_int,
    attr_ints,
    attr_str,
    check_dtype,
    define,
    invalid,
    norm_axes,
    wide,
)
from .opdef import TensorSpec

MODES = ("nearest", "linear", "cubic")
COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
               "tf_half_pixel_for_nn", "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
POLICIES = ("stretch", "not_larger", "not_smaller")
ATTRS = ("mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a", "exclude_outside",
         "extrapolation_value", "antialias", "axes", "keep_aspect_ratio_policy", "roi", "scales", "sizes")


def _float_list(attrs: dict, name: str):
    value = attrs.get(name)
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in value):
        raise invalid("Resize", f"attribute {name}={value!r} must be a list of numbers")
    return [float(v) for v in value]


def _plan(shape: tuple[int, ...], attrs: dict):
    """(output shape, scale per dim) of a Resize of ``shape``; also checks every attribute."""
    mode = attr_str("Resize", attrs, "mode", "nearest", MODES)
    coord = attr_str("Resize", attrs, "coordinate_transformation_mode", "half_pixel", COORD_MODES)
    attr_str("Resize", attrs, "nearest_mode", "round_prefer_floor", NEAREST_MODES)
    policy = attr_str("Resize", attrs, "keep_aspect_ratio_policy", "stretch", POLICIES)
    attr_float("Resize", attrs, "cubic_coeff_a", -0.75)
    attr_float("Resize", attrs, "extrapolation_value", 0.0)
    attr_int("Resize", attrs, "exclude_outside", 0)
    if mode == "cubic":
        raise invalid("Resize", "mode='cubic' is not supported (supported: 'nearest', 'linear')")
    if coord == "tf_crop_and_resize":
        raise invalid("Resize", "coordinate_transformation_mode='tf_crop_and_resize' is not supported")
    if attr_int("Resize", attrs, "antialias", 0):
        raise invalid("Resize", f"antialias={attrs['antialias']} is not supported (expected 0)")
    if _float_list(attrs, "roi"):
        raise invalid("Resize", f"roi={attrs['roi']} is not supported (expected none or empty: roi only "
                                f"matters for tf_crop_and_resize)")
    rank = len(shape)
    axes = attr_ints("Resize", attrs, "axes", None)
    axes = list(range(rank)) if axes is None else norm_axes("Resize", axes, rank)
    scales, sizes = _float_list(attrs, "scales") or None, attr_ints("Resize", attrs, "sizes", None) or None
    if (scales is None) == (sizes is None):
        raise invalid("Resize", "give exactly one of the attributes 'scales' and 'sizes' (non-empty)")
    given = scales if scales is not None else sizes
    if len(given) != len(axes):
        raise invalid("Resize", f"{'scales' if scales else 'sizes'} {given} has {len(given)} values but X has "
                                f"{len(axes)} resized axes (shape {shape})")
    out, scale = list(shape), [1.0] * rank
    if scales is not None:
        if any(s <= 0 or not math.isfinite(s) for s in scales):
            raise invalid("Resize", f"scales {scales} (expected finite values > 0)")
        for a, s in zip(axes, scales):
            scale[a] = s
            out[a] = math.floor(shape[a] * s) if shape[a] >= 0 else -1
        return tuple(out), scale, axes
    if any(s < 0 for s in sizes):
        raise invalid("Resize", f"sizes {sizes} (expected values >= 0)")
    if any(shape[a] < 0 for a in axes):
        if policy != "stretch":
            raise invalid("Resize", f"keep_aspect_ratio_policy={policy!r} needs known dims, X is {shape}")
        for a, s in zip(axes, sizes):
            out[a], scale[a] = s, (s / shape[a] if shape[a] > 0 else 1.0)
        return tuple(out), scale, axes
    ratios = [s / shape[a] if shape[a] else 1.0 for a, s in zip(axes, sizes)]
    if policy != "stretch":
        one = min(ratios) if policy == "not_larger" else max(ratios)
        ratios = [one] * len(axes)
        sizes = [int(one * shape[a] + 0.5) for a in axes]
    for a, s, r in zip(axes, sizes, ratios):
        out[a], scale[a] = s, r
    return tuple(out), scale, axes


def _resize_infer(specs, attrs):
    (x,) = specs
    mode = attr_str("Resize", attrs, "mode", "nearest", MODES)
    check_dtype("Resize", "X", x, NUMERIC if mode == "nearest" else FLOATS)
    out, _, _ = _plan(x.shape, attrs)
    return [TensorSpec(out, x.dtype)]


def _source_coords(coord: str, n_in: int, n_out: int, scale: float) -> np.ndarray:
    x = np.arange(n_out, dtype=F64)
    if coord == "align_corners":
        return x * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(n_out)
    if coord == "asymmetric":
        return x / scale
    if coord == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    if coord == "pytorch_half_pixel" and n_out <= 1:
        return np.zeros(n_out)
    base = (x + 0.5) / scale - 0.5
    if coord == "half_pixel_symmetric":
        adjustment = n_out / (scale * n_in)
        base = base + (n_in / 2.0) * (1.0 - adjustment)
    return base


def _nearest_index(src: np.ndarray, nearest_mode: str, n_in: int) -> np.ndarray:
    rounded = {"round_prefer_floor": lambda v: np.ceil(v - 0.5), "round_prefer_ceil": lambda v: np.floor(v + 0.5),
               "floor": np.floor, "ceil": np.ceil}[nearest_mode](src)
    return np.clip(rounded, 0, n_in - 1).astype(np.int64)


def _resize_compute(inputs, outputs, attrs):
    """Y = X resized on ``axes`` to ``sizes`` or by ``scales`` (see the module doc for the modes)."""
    x = inputs[0]
    out, scale, axes = _plan(x.shape, attrs)
    mode = attr_str("Resize", attrs, "mode", "nearest", MODES)
    coord = attr_str("Resize", attrs, "coordinate_transformation_mode", "half_pixel", COORD_MODES)
    nearest_mode = attr_str("Resize", attrs, "nearest_mode", "round_prefer_floor", NEAREST_MODES)
    y = x if mode == "nearest" else wide(x)
    for a in axes:
        n_in, n_out = x.shape[a], out[a]
        if n_out == n_in and scale[a] == 1.0:
            continue  # every mode maps an unscaled axis onto itself
        if n_in == 0 or n_out == 0:
            y = np.zeros(y.shape[:a] + (n_out,) + y.shape[a + 1:], y.dtype)
            continue
        src = _source_coords(coord, n_in, n_out, scale[a])
        if mode == "nearest":
            y = np.take(y, _nearest_index(src, nearest_mode, n_in), axis=a)
            continue
        src = np.clip(src, 0.0, n_in - 1)
        lo = np.floor(src).astype(np.int64)
        hi = np.minimum(lo + 1, n_in - 1)
        w = (src - lo).astype(y.dtype).reshape((-1,) + (1,) * (y.ndim - a - 1))
        y = np.take(y, lo, axis=a) * (1 - w) + np.take(y, hi, axis=a) * w
    outputs[0][...] = y


define("Resize", "resize", _resize_infer, _resize_compute, attrs=ATTRS)


# ---------------------------------------------------------------- Upsample (opset 7-9; Resize since opset 10)

def _as_resize(attrs: dict) -> dict:
    mode = attr_str("Upsample", attrs, "mode", "nearest", ("nearest", "linear", "bilinear"))
    if attrs.get("scales") is None:
        raise invalid("Upsample", "attribute 'scales' is required (one value >= 1 per dim)")
    scales = _float_list(attrs, "scales")
    if any(s < 1 for s in scales):
        raise invalid("Upsample", f"scales {scales} (expected values >= 1)")
    return {"scales": scales, "mode": "nearest" if mode == "nearest" else "linear",
            "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}


def _upsample_infer(specs, attrs):
    return _resize_infer(specs, _as_resize(attrs))


def _upsample_compute(inputs, outputs, attrs):
    """Y = X scaled up by ``scales`` (output floor(in · scale)): Resize with asymmetric coordinates,
    nearest flooring, or linear ('bilinear' is linear)."""
    _resize_compute(inputs, outputs, _as_resize(attrs))


define("Upsample", "upsample", _upsample_infer, _upsample_compute, attrs=("mode", "scales"))
