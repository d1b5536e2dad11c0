"""Checking the arguments of public calls: one place that turns a wrong type or value into the real code.

Every public entry point validates what it is given before anything goes to a card, so a bad argument is
an ``NpuError`` naming the call, the parameter, the value and what was expected — never a TypeError from
deep inside, an OverflowError from the wire encoder, or a hang. ``error`` picks the error class and code
(``AclError`` 100000 by default; a package above rt passes its own, e.g. HCCL's ``HCCL_E_PARA``).
"""

from __future__ import annotations

import math
import numbers
from typing import Callable

import numpy as np

from .constants import AclErrorCode
from .errors import AclError, NpuError

INT64_MAX = (1 << 63) - 1


def acl_param(message: str) -> NpuError:
    return AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM, message)


def shown(value) -> str:
    """A short, safe rendering of a bad value for messages."""
    if isinstance(value, int) and value.bit_length() > 256:    # repr of a 5000-digit int raises ValueError
        return f"<{'negative ' if value < 0 else ''}{value.bit_length()}-bit int>"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not escape either
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def is_int(value) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def integer(value, call: str, name: str, *, lo: int = 0, hi: int = INT64_MAX,
            error: Callable[[str], NpuError] = acl_param) -> int:
    """``value`` as an int in [lo, hi]."""
    if not is_int(value) or not lo <= int(value) <= hi:
        bound = f">= {lo}" if hi == INT64_MAX else f"in [{lo}, {hi}]"
        raise error(f"{call}: {name} must be an int {bound}, got {shown(value)}")
    return int(value)


def flag(value, call: str, name: str, *, error: Callable[[str], NpuError] = acl_param) -> bool:
    """A bool, or the ints 0 / 1 (C-style flags)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if is_int(value) and int(value) in (0, 1):
        return bool(value)
    raise error(f"{call}: {name} must be True/False (or 0/1), got {shown(value)}")


def number(value, call: str, name: str, *, lo: float = 0.0, hi: float = math.inf,
           error: Callable[[str], NpuError] = acl_param) -> float:
    """A finite real number in [lo, hi]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise error(f"{call}: {name} must be a number, got {shown(value)}")
    try:
        v = float(value)
    except (OverflowError, ValueError):   # an int (or Fraction) past float's range: out of any finite range
        v = math.inf
    if not math.isfinite(v) or not lo <= v <= hi:
        raise error(f"{call}: {name} must be a finite number in [{lo:g}, {hi:g}], got {shown(value)}")
    return v


def int_list(value, call: str, name: str, *, length: int | None = None, lo: int = 0, hi: int = INT64_MAX,
             error: Callable[[str], NpuError] = acl_param) -> list[int]:
    """A list/tuple (or 1-d integer array) of ints in [lo, hi], of ``length`` items if given."""
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu":
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(is_int(v) and lo <= int(v) <= hi for v in value):
        raise error(f"{call}: {name} must be a list of ints in [{lo}, {hi}], got {shown(value)}")
    if length is not None and len(value) != length:
        raise error(f"{call}: {name} must list {length} ints, got {len(value)}: {shown(value)}")
    return [int(v) for v in value]


def instance(value, cls, call: str, name: str, what: str, *, error: Callable[[str], NpuError] = acl_param):
    """``value`` if it is a ``cls``."""
    if not isinstance(value, cls):
        raise error(f"{call}: {name} {shown(value)} is not {what}")
    return value


def sequence(value, call: str, name: str, *, error: Callable[[str], NpuError] = acl_param) -> list:
    """A list or tuple, as a list."""
    if not isinstance(value, (list, tuple)):
        raise error(f"{call}: {name} must be a list, got {shown(value)}")
    return list(value)


def text(value, call: str, name: str, *, error: Callable[[str], NpuError] = acl_param) -> str:
    if not isinstance(value, str):
        raise error(f"{call}: {name} must be a str, got {shown(value)}")
    return value
