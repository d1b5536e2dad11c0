"""Sliding-window geometry shared by Conv and the pooling ops (ONNX semantics).

Inputs are ``(N, C, D1, ..., Dn)``. A window has ``kernel_shape``, ``strides``, ``dilations`` and
``pads`` (``[x1_begin, x2_begin, ..., x1_end, x2_end, ...]``), or ``auto_pad`` (``SAME_UPPER`` /
``SAME_LOWER``: output ``ceil(D / stride)``, the odd pad at the end / the beginning; ``VALID``: no
pads). ``ceil_mode`` (pools) rounds the output size up, dropping a last window that would start in
the end padding. The compute side pads once and then walks the kernel offsets, each offset one
strided numpy slice over the whole batch: no Python loop over pixels.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from .common import attr_bool, attr_ints, attr_str, invalid

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclasses.dataclass(frozen=True)
class Window:
    """The resolved geometry of one windowed op over concrete (or -1) spatial dims."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]   # pads before each spatial dim
    end: tuple[int, ...]     # pads after (explicit ones; ceil_mode may read further, see ``extra``)
    out: tuple[int, ...]     # output spatial dims (-1 where the input dim is dynamic)

    def extra(self, spatial: tuple[int, ...]) -> tuple[int, ...]:
        """Elements past the explicit end pad that the last window reads (ceil_mode), per dim."""
        return tuple(max(0, (o - 1) * s + (k - 1) * d + 1 - (n + b + e))
                     for o, s, k, d, n, b, e in zip(self.out, self.strides, self.kernel, self.dilations,
                                                    spatial, self.begin, self.end))


def _per_dim(op: str, attrs: dict, name: str, n: int, default: int, minimum: int) -> tuple[int, ...]:
    values = attr_ints(op, attrs, name, None)
    if values is None:
        return (default,) * n
    if len(values) != n or any(v < minimum for v in values):
        raise invalid(op, f"attribute {name}={values} (expected {n} values >= {minimum}, one per spatial dim)")
    return tuple(values)


def window(op: str, attrs: dict, spatial: tuple[int, ...], kernel: tuple[int, ...], *,
           pool: bool = False) -> Window:
    """Resolve strides/dilations/pads/auto_pad of ``op`` for input spatial dims ``spatial``; a ``pool``
    also has ``ceil_mode`` and needs each pad smaller than the kernel extent (as onnxruntime)."""
    n = len(spatial)
    strides = _per_dim(op, attrs, "strides", n, 1, 1)
    dilations = _per_dim(op, attrs, "dilations", n, 1, 1)
    auto_pad = attr_str(op, attrs, "auto_pad", "NOTSET", AUTO_PADS)
    ceil_mode = attr_bool(op, attrs, "ceil_mode", False) if pool else False
    pads = attr_ints(op, attrs, "pads", None)
    if pads is not None and (len(pads) != 2 * n or any(p < 0 for p in pads)):
        raise invalid(op, f"attribute pads={pads} (expected {2 * n} values >= 0: begins then ends of "
                          f"{n} spatial dims)")
    if pads is not None and auto_pad != "NOTSET" and any(pads):
        raise invalid(op, f"attribute pads={pads} with auto_pad={auto_pad!r} (give one or the other)")
    span = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
    begin, end, out = [], [], []
    for i, (dim, s, w) in enumerate(zip(spatial, strides, span)):
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-dim // s) if dim >= 0 else -1
            total = max(0, (o - 1) * s + w - dim) if dim >= 0 else 0
            small, big = total // 2, total - total // 2
            b, e = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
        else:
            b, e = (0, 0) if auto_pad == "VALID" or pads is None else (pads[i], pads[n + i])
            if pool and (b >= w or e >= w):
                raise invalid(op, f"pads {pads} on spatial dim {i} are not smaller than the kernel extent {w} "
                                  f"(kernel {kernel[i]}, dilation {dilations[i]})")
            o = _out_dim(dim, b + e, w, s, ceil_mode) if dim >= 0 else -1
            if o >= 1 and ceil_mode and (o - 1) * s >= dim + b:
                o -= 1  # the last window would start in the end padding
        if dim >= 0 and o < 1:
            raise invalid(op, f"spatial dim {i} of size {dim} with pads ({b}, {e}) is smaller than the kernel "
                              f"extent {w} (kernel {kernel[i]}, dilation {dilations[i]}): no output")
        begin.append(b)
        end.append(e)
        out.append(o)
    return Window(tuple(kernel), strides, dilations, tuple(begin), tuple(end), tuple(out))


def _out_dim(dim: int, pad: int, span: int, stride: int, ceil_mode: bool) -> int:
    room = dim + pad - span
    if room < 0:
        return 0
    return (-(-room // stride) if ceil_mode else room // stride) + 1


def check_spatial_input(op: str, shape: tuple[int, ...], name: str = "X") -> tuple[int, ...]:
    """The spatial dims of an ``(N, C, D1, ...)`` input (rank >= 3)."""
    if len(shape) < 3:
        raise invalid(op, f"{name} has shape {shape} (expected (N, C, D1, ...), rank >= 3)")
    return tuple(shape[2:])


def padded(x: np.ndarray, win: Window, value: float) -> np.ndarray:
    """``x`` with its spatial dims padded by the window's pads (plus the ceil_mode overhang) with ``value``."""
    spatial = x.shape[2:]
    extra = win.extra(spatial)
    widths = [(0, 0), (0, 0)] + [(b, e + x_) for b, e, x_ in zip(win.begin, win.end, extra)]
    if not any(b or e for b, e in widths):
        return x
    out = np.full(x.shape[:2] + tuple(n + b + e for n, (b, e) in zip(spatial, widths[2:])), value, x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(b, b + n) for n, (b, _) in zip(spatial, widths[2:]))] = x
    return out


def padded_last(x: np.ndarray, win: Window, value: float) -> np.ndarray:
    """Like :func:`padded`, but channels last, ``(N, *padded spatial, C)``, in one copy of ``x``."""
    spatial = x.shape[2:]
    widths = [(b, e + x_) for b, e, x_ in zip(win.begin, win.end, win.extra(spatial))]
    shape = (x.shape[0],) + tuple(n + b + e for n, (b, e) in zip(spatial, widths)) + (x.shape[1],)
    out = np.full(shape, value, x.dtype) if any(b or e for b, e in widths) else np.empty(shape, x.dtype)
    interior = tuple(slice(b, b + n) for n, (b, _) in zip(spatial, widths))
    out[(slice(None),) + interior + (slice(None),)] = np.moveaxis(x, 1, -1)
    return out


def offsets(win: Window):
    """Every kernel offset as a tuple of per-dim slices into the padded input: ``(index, slices)``."""
    for flat, pos in enumerate(itertools.product(*(range(k) for k in win.kernel))):
        yield flat, tuple(slice(p * d, p * d + (o - 1) * s + 1, s)
                          for p, d, o, s in zip(pos, win.dilations, win.out, win.strides))


def kernel_size(win: Window) -> int:
    return math.prod(win.kernel)
