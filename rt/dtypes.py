"""The one dtype table: numpy dtypes, their aclDataType codes, and the names people type for them.

Everything on the Python side spells a dtype as a numpy dtype; :func:`np_dtype` accepts an aclDataType code
(0 is float32), a numpy dtype or a name (``"float32"``, ``"bf16"``, ``"fp16"``) and is what every ``dtype=``
argument goes through. A package with codes of its own maps them onto numpy dtypes itself (and may use
:func:`lookup` for the names).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .args import shown
from .constants import AclErrorCode, DataType
from .errors import AclError

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

# aclDataType <-> numpy. One spelling: numpy dtypes everywhere on the Python side.
ACL_TO_NP = {
    DataType.ACL_FLOAT: np.dtype(np.float32),
    DataType.ACL_FLOAT16: np.dtype(np.float16),
    DataType.ACL_INT8: np.dtype(np.int8),
    DataType.ACL_INT32: np.dtype(np.int32),
    DataType.ACL_UINT8: np.dtype(np.uint8),
    DataType.ACL_INT16: np.dtype(np.int16),
    DataType.ACL_UINT16: np.dtype(np.uint16),
    DataType.ACL_UINT32: np.dtype(np.uint32),
    DataType.ACL_INT64: np.dtype(np.int64),
    DataType.ACL_UINT64: np.dtype(np.uint64),
    DataType.ACL_DOUBLE: np.dtype(np.float64),
    DataType.ACL_BOOL: np.dtype(np.bool_),
    DataType.ACL_COMPLEX64: np.dtype(np.complex64),
    DataType.ACL_COMPLEX128: np.dtype(np.complex128),
    DataType.ACL_BF16: BFLOAT16,
}
NP_TO_ACL = {v: k for k, v in ACL_TO_NP.items()}


# Names people type for dtypes, beyond numpy's own.
DTYPE_ALIASES = {name: np.dtype(t) for name, t in {
    "bf16": BFLOAT16, "bfloat16": BFLOAT16, "bfp16": BFLOAT16, "fp16": np.float16, "half": np.float16,
    "fp32": np.float32, "float": np.float32, "fp64": np.float64, "double": np.float64}.items()}


def lookup(dtype) -> np.dtype | None:
    """The numpy dtype a name or dtype-like means (aliases included), or None if it means none."""
    if isinstance(dtype, str) and dtype.lower() in DTYPE_ALIASES:
        return DTYPE_ALIASES[dtype.lower()]
    if dtype is None or isinstance(dtype, (bool, int, float, np.generic)) and not isinstance(dtype, type):
        return None                     # np.dtype(None) is float64 (numpy's default), np.dtype(5) an error
    try:
        return np.dtype(dtype)
    except (TypeError, ValueError):
        return None


def np_dtype(dtype) -> np.dtype:
    """Accept an aclDataType code (``DataType``: 0 is float32), a numpy dtype or a name ('float32', 'bfloat16',
    'fp16')."""
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        try:
            return ACL_TO_NP[DataType(int(dtype))]
        except (ValueError, KeyError):
            raise AclError(AclErrorCode.ACL_ERROR_UNSUPPORTED_DATA_TYPE,
                           f"unsupported aclDataType {shown(dtype)}") from None
    dt = lookup(dtype)
    if dt is None:
        raise AclError(AclErrorCode.ACL_ERROR_UNSUPPORTED_DATA_TYPE, f"unknown dtype {shown(dtype)}")
    if dt not in NP_TO_ACL:
        raise AclError(AclErrorCode.ACL_ERROR_UNSUPPORTED_DATA_TYPE,
                       f"dtype {dt} has no aclDataType (supported: {sorted(str(d) for d in NP_TO_ACL)})")
    return dt


def acl_dtype(dtype) -> DataType:
    return NP_TO_ACL[np_dtype(dtype)]


def data_type_size(dtype) -> int:
    """Bytes per element, as acl.data_type_size."""
    return np_dtype(dtype).itemsize


