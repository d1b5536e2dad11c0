"""HCCL enums with their real values (HcclResult, HcclDataType, HcclReduceOp), C-name aliases,
the dtype mapping to numpy and the reduce operators applied to numpy arrays."""

from __future__ import annotations

import enum

import numpy as np

from rt import args, dtypes
from rt.dtypes import BFLOAT16

from .errors import HcclError


class HcclResult(enum.IntEnum):
    """Return codes of the HCCL C API (hccl_types.h)."""

    HCCL_SUCCESS = 0
    HCCL_E_PARA = 1
    HCCL_E_PTR = 2
    HCCL_E_MEMORY = 3
    HCCL_E_INTERNAL = 4
    HCCL_E_NOT_SUPPORT = 5
    HCCL_E_NOT_FOUND = 6
    HCCL_E_UNAVAIL = 7
    HCCL_E_SYSCALL = 8
    HCCL_E_TIMEOUT = 9
    HCCL_E_OPEN_FILE_FAILURE = 10
    HCCL_E_TCP_CONNECT = 11
    HCCL_E_ROCE_CONNECT = 12
    HCCL_E_TCP_TRANSFER = 13
    HCCL_E_ROCE_TRANSFER = 14
    HCCL_E_RUNTIME = 15
    HCCL_E_DRV = 16
    HCCL_E_PROFILING = 17
    HCCL_E_CCE = 18
    HCCL_E_NETWORK = 19
    HCCL_E_AGAIN = 20
    HCCL_E_REMOTE = 21
    HCCL_E_SUSPENDING = 22
    HCCL_E_OPRETRY_FAIL = 23
    HCCL_E_OOM = 24
    HCCL_E_IN_STATUS = 1041


class HcclDataType(enum.IntEnum):
    """Element types of HCCL buffers; the C names are ``HCCL_DATA_TYPE_<name>``."""

    INT8 = 0
    INT16 = 1
    INT32 = 2
    FP16 = 3
    FP32 = 4
    INT64 = 5
    UINT64 = 6
    UINT8 = 7
    UINT16 = 8
    UINT32 = 9
    FP64 = 10
    BFP16 = 11
    INT128 = 12
    HIF8 = 14
    FP8E4M3 = 15
    FP8E5M2 = 16
    FP8E8M0 = 17
    RESERVED = 255


class HcclReduceOp(enum.IntEnum):
    """Reduction operators; the C names are ``HCCL_REDUCE_<name>``."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    RESERVED = 255


# Module-level C names: HCCL_SUCCESS, HCCL_E_TIMEOUT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, ...
C_NAMES: dict[str, enum.IntEnum] = {m.name: m for m in HcclResult}
C_NAMES.update({f"HCCL_DATA_TYPE_{m.name}": m for m in HcclDataType})
C_NAMES.update({f"HCCL_REDUCE_{m.name}": m for m in HcclReduceOp})
globals().update(C_NAMES)
__all__ = ["HcclResult", "HcclDataType", "HcclReduceOp", "hccl_dtype", "hccl_np_dtype", "reduce_op", *C_NAMES]

_TO_NP = {
    HcclDataType.INT8: np.dtype(np.int8),
    HcclDataType.INT16: np.dtype(np.int16),
    HcclDataType.INT32: np.dtype(np.int32),
    HcclDataType.FP16: np.dtype(np.float16),
    HcclDataType.FP32: np.dtype(np.float32),
    HcclDataType.INT64: np.dtype(np.int64),
    HcclDataType.UINT64: np.dtype(np.uint64),
    HcclDataType.UINT8: np.dtype(np.uint8),
    HcclDataType.UINT16: np.dtype(np.uint16),
    HcclDataType.UINT32: np.dtype(np.uint32),
    HcclDataType.FP64: np.dtype(np.float64),
    HcclDataType.BFP16: BFLOAT16,
}
_FROM_NP = {v: k for k, v in _TO_NP.items()}
_FROM_NP[np.dtype(np.bool_)] = HcclDataType.UINT8      # torch_npu sends bool tensors as UINT8


_NP_BY_CODE = {int(k): v for k, v in _TO_NP.items()}          # the hot path: a supported code as a plain int
_TYPE_BY_CODE = {int(k): k for k in _TO_NP}
# The hot path of a tensor's dtype: numpy's dtypes of the builtin types are singletons, looked up by identity (a
# numpy dtype's hash is computed anew on every call); the dtype is kept with its member, so a reused id never
# matches another object.
_TYPE_BY_DTYPE_ID = {id(dt): (dt, member) for dt, member in _FROM_NP.items()}


def hccl_np_dtype(dtype) -> np.dtype:
    """Numpy dtype of an HcclDataType code (0 is INT8 here; ``rt.np_dtype`` reads aclDataType codes, where 0 is
    float32), a numpy dtype or a name ('fp32', 'bf16', 'int8')."""
    if type(dtype) is int:
        dt = _NP_BY_CODE.get(dtype)
        if dt is not None:
            return dt
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        code = int(dtype)
        if code not in HcclDataType._value2member_map_:
            raise HcclError(HcclResult.HCCL_E_PARA,
                            f"unknown HcclDataType {args.shown(code)} (valid: {[int(m) for m in HcclDataType]})")
        if HcclDataType(code) not in _TO_NP:
            raise HcclError(HcclResult.HCCL_E_NOT_SUPPORT,
                            f"HcclDataType {HcclDataType(code).name} ({code}) is not supported; supported: "
                            f"{[m.name for m in _TO_NP]}")
        return _TO_NP[HcclDataType(code)]
    dt = dtypes.lookup(dtype)                      # names and aliases as rt spells them ('fp32', 'bfp16', ...)
    if dt is None:
        raise HcclError(HcclResult.HCCL_E_PARA, f"unknown dtype {args.shown(dtype)}")
    if dt not in _FROM_NP:
        raise HcclError(HcclResult.HCCL_E_NOT_SUPPORT,
                        f"dtype {dt} has no HcclDataType (supported: {sorted(str(d) for d in _TO_NP.values())})")
    return dt


def hccl_dtype(dtype) -> HcclDataType:
    """The HcclDataType of a numpy dtype, name or code (bool maps to UINT8 as in torch_npu)."""
    known = _TYPE_BY_DTYPE_ID.get(id(dtype))
    if known is not None and known[0] is dtype:
        return known[1]
    if type(dtype) is int or isinstance(dtype, HcclDataType):
        member = _TYPE_BY_CODE.get(int(dtype))
        if member is not None:
            return member
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        hccl_np_dtype(dtype)  # validates the code
        return HcclDataType(int(dtype))
    return _FROM_NP[hccl_np_dtype(dtype)]


def reduce_op(op) -> HcclReduceOp:
    """Normalize an HcclReduceOp given as enum, int code or name ('sum', 'HCCL_REDUCE_MAX')."""
    if type(op) is int and 0 <= op <= 3 or isinstance(op, HcclReduceOp) and op.value <= 3:
        return _OPS[int(op)]
    if isinstance(op, str):
        name = op.upper().removeprefix("HCCL_REDUCE_")
        if name in HcclReduceOp.__members__ and name != "RESERVED":
            return HcclReduceOp[name]
    elif isinstance(op, (int, np.integer)) and not isinstance(op, bool) and int(op) in (0, 1, 2, 3):
        return HcclReduceOp(int(op))
    raise HcclError(HcclResult.HCCL_E_PARA,
                    f"unknown HcclReduceOp {args.shown(op)} (expected SUM=0, PROD=1, MAX=2, MIN=3 or their names)")


_OPS = {int(m): m for m in HcclReduceOp if m.name != "RESERVED"}
_UFUNCS = {HcclReduceOp.SUM: np.add, HcclReduceOp.PROD: np.multiply,
           HcclReduceOp.MAX: np.maximum, HcclReduceOp.MIN: np.minimum}


def reduce_ufunc(op) -> np.ufunc:
    """The numpy ufunc behind a reduce op (for oracles and executors)."""
    return _UFUNCS[reduce_op(op)]


def apply_reduce(op, dst: np.ndarray, src: np.ndarray) -> np.ndarray:
    """dst = op(dst, src) elementwise, in place.

    The arithmetic happens in dst's dtype, as the hardware produces its output dtype: fp16/bf16
    round after every step and integers wrap on overflow (numpy array ufuncs wrap silently).
    """
    if dst.shape != src.shape:
        raise HcclError(HcclResult.HCCL_E_PARA,
                        f"apply_reduce: shapes differ, dst {dst.shape} vs src {src.shape}")
    _UFUNCS[reduce_op(op)](dst, src, out=dst, casting="unsafe")
    return dst
