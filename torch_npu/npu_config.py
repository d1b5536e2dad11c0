"""torch_npu's compile and precision options: ``torch.npu.set_option``, ``set_compile_mode``, ``set_aoe``,
``config.allow_internal_format``, ``matmul.allow_hf32`` / ``cube_math_type``, ``conv.allow_hf32``.

They are validated as torch_npu validates them and remembered (``get_option``), so scripts that set them run
unchanged; none of them changes a result here — npusim's kernels are the host's, with no operator compiler,
HF32 arithmetic or internal formats to select.
"""

from __future__ import annotations

import os
from enum import IntEnum

from ._error_code import ErrCode, pta_error

_CHOICES = {"ACL_PRECISION_MODE": ("allow_fp32_to_fp16", "must_keep_origin_dtype"),
            "ACL_OP_SELECT_IMPL_MODE": ("high_performance", "high_precision"),
            "ACL_OP_DEBUG_LEVEL": ("0", "1", "2", "3", "4"),
            "ACL_OP_COMPILER_CACHE_MODE": ("disable", "enable", "force")}
_options: dict[str, str] = {}
_MM_BMM_ND_ENABLE = True


class CubeMathType(IntEnum):
    KEEP_DTYPE = 0
    ALLOW_FP32_DOWN_PRECISION = 1
    USE_FP16 = 2
    USE_HF32 = 3
    USE_FP32_ADD = 4


def _check(name: str, value: str) -> None:
    if name == "ACL_AICORE_NUM":
        if not (value.isdigit() and 1 <= int(value) <= 32):
            raise ValueError(f"value of {name} should be in value.isdigit() and 1 <= int(value) <= 32 but got "
                             f"{value}" + pta_error(ErrCode.PARAM))
    elif name in _CHOICES and value not in _CHOICES[name]:
        raise ValueError(f"value of {name} should be in {list(_CHOICES[name])} but got {value}"
                         + pta_error(ErrCode.PARAM))


def set_option(option) -> None:
    """``torch.npu.set_option({"ACL_PRECISION_MODE": "allow_fp32_to_fp16", ...})``: validated, remembered."""
    if not isinstance(option, dict):
        raise TypeError("npu option must be a dict." + pta_error(ErrCode.PARAM))
    if option.get("MM_BMM_ND_ENABLE") in ("enable", "disable"):
        set_mm_bmm_format_nd(option["MM_BMM_ND_ENABLE"] == "enable")
    for name, value in option.items():
        _check(name, str(value))
        option[name] = str(value)
    _options.update(option)


def get_option(name: str):
    """The value last set for an option (bytes, as torch_npu's ``_npu_getOption``), or None."""
    value = _options.get(name)
    return None if value is None else value.encode()


def set_compile_mode(jit_compile=False) -> None:
    _options["jitCompile"] = "enable" if jit_compile else "disable"


def is_jit_compile_false() -> bool:
    return _options.get("jitCompile", "disable") == "disable"


def set_aoe(dump_path) -> None:
    """Accepted; creates ``dump_path`` as torch_npu does (no operator tuning runs here)."""
    try:
        os.makedirs(dump_path, exist_ok=True)
    except TypeError:
        raise TypeError("Type of dump_path is invalid." + pta_error(ErrCode.TYPE)) from None
    except OSError:
        raise OSError("Value of dump_path is invalid." + pta_error(ErrCode.SYSCALL)) from None
    _options.update({"autotune": "enable", "autotunegraphdumppath": str(dump_path)})


def set_mm_bmm_format_nd(is_nd=True) -> None:
    global _MM_BMM_ND_ENABLE
    _MM_BMM_ND_ENABLE = bool(is_nd)


def get_mm_bmm_format_nd() -> bool:
    return _MM_BMM_ND_ENABLE


class _Settings:
    """An attribute namespace whose assignments become options (``torch.npu.matmul.allow_hf32 = True``)."""

    def __init__(self, names: dict):
        object.__setattr__(self, "_names", names)

    def __setattr__(self, name, value):
        option = self._names.get(name)
        if option is None:
            object.__setattr__(self, name, value)
            return
        if name == "allow_hf32" and not isinstance(value, bool):
            raise TypeError(f"allow_hf32 must be a bool, but got {type(value).__name__}" + pta_error(ErrCode.TYPE))
        if name == "cube_math_type":
            if not isinstance(value, CubeMathType):
                raise TypeError(f"value should be one of Enum CubeMathType when setting cube_math_type, but got "
                                f"{type(value)}")
            _options[option] = str(int(value))
        else:
            _options[option] = "enable" if value else "disable"

    def __getattr__(self, name):
        option = self._names.get(name)
        if option is None:
            raise AttributeError(name)
        value = _options.get(option)
        if name == "cube_math_type":
            return None if not value else CubeMathType(int(value))
        if name == "allow_hf32" and option == "ALLOW_CONV_HF32":
            return value in (None, "", "enable")
        return value == "enable"


config = _Settings({"allow_internal_format": "ALLOW_INTERNAL_FORMAT"})
matmul = _Settings({"allow_hf32": "ALLOW_MATMUL_HF32", "cube_math_type": "CUBE_MATH_TYPE"})
conv = _Settings({"allow_hf32": "ALLOW_CONV_HF32"})

__all__ = ["CubeMathType", "config", "conv", "get_mm_bmm_format_nd", "get_option", "is_jit_compile_false", "matmul",
           "set_aoe", "set_compile_mode", "set_mm_bmm_format_nd", "set_option"]
