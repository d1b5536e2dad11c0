"""torch_npu's storage formats: ``torch_npu.Format``, ``npu_format_cast``, ``npu_format_cast_``, ``get_npu_format``.

On hardware an NPU tensor's storage has a format (ND, NCHW, NC1HWC0, FRACTAL_NZ, ...) that decides its physical
layout, and a cast re-lays the bytes out. npusim **tracks** the format — a cast records it on the tensor and
``get_npu_format`` reports it — but never changes the data: every tensor keeps torch's logical layout, so every
op reads it correctly whatever its format. A tensor's format is its base format (NCHW for 4-D, NCDHW for 5-D,
ND otherwise) until a cast sets another; results of other ops, and views, start again from the base format.

The functions here are the kernels of ``torch.ops.npu.npu_format_cast`` / ``npu_format_cast_`` /
``get_npu_format`` (``op_plugin.py`` registers them for npu tensors, as torch_npu does: a CPU tensor is refused
by the dispatcher); ``torch_npu.npu_format_cast``... call those ops.
"""

from __future__ import annotations

from enum import IntEnum

import torch

from ._error_code import ErrCode, ops_error


class Format(IntEnum):
    """NPU storage formats (torch_npu.Format; the values are ACL's aclFormat)."""
    UNDEFINED = -1
    NCHW = 0
    NHWC = 1
    ND = 2
    NC1HWC0 = 3
    FRACTAL_Z = 4
    NC1HWC0_C04 = 12
    HWCN = 16
    NDHWC = 27
    FRACTAL_NZ = 29
    NCDHW = 30
    NDC1HWC0 = 32
    FRACTAL_Z_3D = 33
    NC = 35
    NCL = 47
    FRACTAL_NZ_C0_16 = 50
    FRACTAL_NZ_C0_32 = 51
    FRACTAL_NZ_C0_2 = 52
    FRACTAL_NZ_C0_4 = 53
    FRACTAL_NZ_C0_8 = 54

    def __str__(self):
        return self.name


_ATTR = "_npusim_npu_format"


def _base_format(t: torch.Tensor) -> Format:
    return {4: Format.NCHW, 5: Format.NCDHW}.get(t.dim(), Format.ND)


def _target(acl_format) -> Format:
    if isinstance(acl_format, bool) or not isinstance(acl_format, int):
        raise TypeError(f"npu_format_cast(): argument 'acl_format' must be int, not {type(acl_format).__name__}")
    try:
        fmt = Format(int(acl_format))
    except ValueError:
        raise RuntimeError(f"npu_format_cast: unsupported acl_format {int(acl_format)} (torch_npu.Format has "
                           f"{sorted(int(f) for f in Format)})" + ops_error(ErrCode.PARAM)) from None
    if fmt is Format.UNDEFINED:
        raise RuntimeError("npu_format_cast: cannot cast to UNDEFINED (-1)" + ops_error(ErrCode.PARAM))
    return fmt


def get_npu_format(tensor: torch.Tensor) -> int:
    """The storage format recorded for ``tensor`` (its base format if none was set)."""
    return int(getattr(tensor, _ATTR, _base_format(tensor)))


def npu_format_cast(input: torch.Tensor, acl_format, *, customize_dtype=None, input_dtype=None) -> torch.Tensor:
    """A new tensor with ``input``'s data and format ``acl_format`` — ``input`` itself if it has that format;
    ``acl_format`` may be a tensor, whose format is taken (the ``.Tensor`` overload). Differentiable: the copy's
    gradient flows back unchanged (the format is storage, not value)."""
    fmt = Format(get_npu_format(acl_format)) if isinstance(acl_format, torch.Tensor) else _target(acl_format)
    if get_npu_format(input) == fmt:
        return input
    out = input.clone()
    setattr(out, _ATTR, int(fmt))
    return out


def npu_format_cast_(input: torch.Tensor, src, *, customize_dtype=None, input_dtype=None) -> torch.Tensor:
    """Set ``input``'s format in place to ``src``'s (a tensor, an int or a ``Format``); returns ``input``."""
    fmt = get_npu_format(src) if isinstance(src, torch.Tensor) else _target(src)
    setattr(input, _ATTR, int(fmt))
    return input


__all__ = ["Format", "get_npu_format", "npu_format_cast", "npu_format_cast_"]
