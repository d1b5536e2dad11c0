"""ACL constants with their real C names and values, as IntEnums plus module-level aliases."""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np


class AclErrorCode(enum.IntEnum):
    ACL_SUCCESS = 0
    ACL_ERROR_INVALID_PARAM = 100000
    ACL_ERROR_UNINITIALIZE = 100001
    ACL_ERROR_REPEAT_INITIALIZE = 100002
    ACL_ERROR_INVALID_FILE = 100003
    ACL_ERROR_WRITE_FILE = 100004
    ACL_ERROR_INVALID_FILE_SIZE = 100005
    ACL_ERROR_PARSE_FILE = 100006
    ACL_ERROR_FILE_MISSING_ATTR = 100007
    ACL_ERROR_FILE_ATTR_INVALID = 100008
    ACL_ERROR_INVALID_DUMP_CONFIG = 100009
    ACL_ERROR_INVALID_PROFILING_CONFIG = 100010
    ACL_ERROR_INVALID_MODEL_ID = 100011
    ACL_ERROR_DESERIALIZE_MODEL = 100012
    ACL_ERROR_PARSE_MODEL = 100013
    ACL_ERROR_READ_MODEL_FAILURE = 100014
    ACL_ERROR_MODEL_SIZE_INVALID = 100015
    ACL_ERROR_MODEL_MISSING_ATTR = 100016
    ACL_ERROR_MODEL_INPUT_NOT_MATCH = 100017
    ACL_ERROR_MODEL_OUTPUT_NOT_MATCH = 100018
    ACL_ERROR_MODEL_NOT_DYNAMIC = 100019
    ACL_ERROR_OP_TYPE_NOT_MATCH = 100020
    ACL_ERROR_OP_INPUT_NOT_MATCH = 100021
    ACL_ERROR_OP_OUTPUT_NOT_MATCH = 100022
    ACL_ERROR_OP_ATTR_NOT_MATCH = 100023
    ACL_ERROR_OP_NOT_FOUND = 100024
    ACL_ERROR_OP_LOAD_FAILED = 100025
    ACL_ERROR_UNSUPPORTED_DATA_TYPE = 100026
    ACL_ERROR_FORMAT_NOT_MATCH = 100027
    ACL_ERROR_REPEAT_SUBSCRIBE = 100033
    ACL_ERROR_STREAM_NOT_SUBSCRIBE = 100034
    ACL_ERROR_THREAD_NOT_SUBSCRIBE = 100035
    ACL_ERROR_WAIT_CALLBACK_TIMEOUT = 100036
    ACL_ERROR_REPEAT_FINALIZE = 100037
    ACL_ERROR_BAD_ALLOC = 200000
    ACL_ERROR_API_NOT_SUPPORT = 200001
    ACL_ERROR_INVALID_DEVICE = 200002
    ACL_ERROR_MEMORY_ADDRESS_UNALIGNED = 200003
    ACL_ERROR_RESOURCE_NOT_MATCH = 200004
    ACL_ERROR_INVALID_RESOURCE_HANDLE = 200005
    ACL_ERROR_FEATURE_UNSUPPORTED = 200006
    ACL_ERROR_STORAGE_OVER_LIMIT = 300000
    ACL_ERROR_INTERNAL_ERROR = 500000
    ACL_ERROR_FAILURE = 500001
    ACL_ERROR_GE_FAILURE = 500002
    ACL_ERROR_RT_FAILURE = 500003
    ACL_ERROR_DRV_FAILURE = 500004
    # runtime codes (rt_error_codes.h)
    ACL_ERROR_RT_PARAM_INVALID = 107000
    ACL_ERROR_RT_INVALID_DEVICEID = 107001
    ACL_ERROR_RT_CONTEXT_NULL = 107002
    ACL_ERROR_RT_STREAM_CONTEXT = 107003
    ACL_ERROR_RT_MODEL_CONTEXT = 107004
    ACL_ERROR_RT_STREAM_MODEL = 107005
    ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID = 107006
    ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL = 107007
    ACL_ERROR_RT_ADDR_UNALIGNED = 107008
    ACL_ERROR_RT_FILE_OPEN = 107009
    ACL_ERROR_RT_FILE_WRITE = 107010
    ACL_ERROR_RT_STREAM_SUBSCRIBE = 107011
    ACL_ERROR_RT_THREAD_SUBSCRIBE = 107012
    ACL_ERROR_RT_STREAM_NO_CB_REG = 107015
    ACL_ERROR_RT_INVALID_MEMORY_TYPE = 107016
    ACL_ERROR_RT_INVALID_HANDLE = 107017
    ACL_ERROR_RT_INVALID_MALLOC_TYPE = 107018
    ACL_ERROR_RT_WAIT_TIMEOUT = 107019
    ACL_ERROR_RT_TASK_TIMEOUT = 107020
    ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000
    ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
    ACL_ERROR_RT_MEMORY_FREE = 207002
    ACL_ERROR_RT_NO_DEVICE = 207004
    ACL_ERROR_RT_RESOURCE_ALLOC_FAIL = 207005
    ACL_ERROR_RT_NO_PERMISSION = 207006
    ACL_ERROR_RT_NO_EVENT_RESOURCE = 207007
    ACL_ERROR_RT_NO_STREAM_RESOURCE = 207008
    ACL_ERROR_RT_OVER_LIMIT = 207012
    ACL_ERROR_RT_DEVICE_OOM = 207018
    ACL_ERROR_RT_TIMEOUT = 207020
    ACL_ERROR_RT_INTERNAL_ERROR = 507000
    ACL_ERROR_RT_STREAM_TASK_FULL = 507002
    ACL_ERROR_RT_STREAM_NOT_COMPLETE = 507004
    ACL_ERROR_RT_EVENT_NOT_COMPLETE = 507006
    ACL_ERROR_RT_CONTEXT_RELEASE_ERROR = 507007
    ACL_ERROR_RT_MODEL_EXECUTE = 507011
    ACL_ERROR_RT_AICORE_TIMEOUT = 507014
    ACL_ERROR_RT_AICORE_EXCEPTION = 507015
    ACL_ERROR_RT_DEV_SETUP_ERROR = 507033
    ACL_ERROR_RT_VECTOR_CORE_TIMEOUT = 507034
    ACL_ERROR_RT_VECTOR_CORE_EXCEPTION = 507035
    ACL_ERROR_RT_STREAM_SYNC_TIMEOUT = 507046
    ACL_ERROR_RT_EVENT_SYNC_TIMEOUT = 507047
    ACL_ERROR_RT_FFTS_PLUS_TIMEOUT = 507048
    ACL_ERROR_RT_LINK_ERROR = 507056
    ACL_ERROR_RT_SOCKET_CLOSE = 507901
    ACL_ERROR_RT_COMM_OP_RETRY_FAIL = 507904


class MemcpyKind(enum.IntEnum):
    ACL_MEMCPY_HOST_TO_HOST = 0
    ACL_MEMCPY_HOST_TO_DEVICE = 1
    ACL_MEMCPY_DEVICE_TO_HOST = 2
    ACL_MEMCPY_DEVICE_TO_DEVICE = 3
    ACL_MEMCPY_DEFAULT = 4
    ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE = 5
    ACL_MEMCPY_INNER_DEVICE_TO_DEVICE = 6
    ACL_MEMCPY_INTER_DEVICE_TO_DEVICE = 7


class MemMallocPolicy(enum.IntEnum):
    ACL_MEM_MALLOC_HUGE_FIRST = 0
    ACL_MEM_MALLOC_HUGE_ONLY = 1
    ACL_MEM_MALLOC_NORMAL_ONLY = 2
    ACL_MEM_MALLOC_HUGE_FIRST_P2P = 3
    ACL_MEM_MALLOC_HUGE_ONLY_P2P = 4
    ACL_MEM_MALLOC_NORMAL_ONLY_P2P = 5
    ACL_MEM_MALLOC_HUGE1G_ONLY = 6
    ACL_MEM_MALLOC_HUGE1G_ONLY_P2P = 7


# OR-able flags accepted on top of a policy.
ACL_MEM_TYPE_LOW_BAND_WIDTH = 0x0100
ACL_MEM_TYPE_HIGH_BAND_WIDTH = 0x1000
ACL_MEM_ACCESS_USER_SPACE_READONLY = 0x100000
MALLOC_POLICY_FLAGS = ACL_MEM_TYPE_LOW_BAND_WIDTH | ACL_MEM_TYPE_HIGH_BAND_WIDTH | ACL_MEM_ACCESS_USER_SPACE_READONLY


class MemAttr(enum.IntEnum):
    ACL_DDR_MEM = 0
    ACL_HBM_MEM = 1
    ACL_DDR_MEM_HUGE = 2
    ACL_DDR_MEM_NORMAL = 3
    ACL_HBM_MEM_HUGE = 4
    ACL_HBM_MEM_NORMAL = 5
    ACL_DDR_MEM_P2P_HUGE = 6
    ACL_DDR_MEM_P2P_NORMAL = 7
    ACL_HBM_MEM_P2P_HUGE = 8
    ACL_HBM_MEM_P2P_NORMAL = 9
    ACL_HBM_MEM_HUGE1G = 10


class StreamStatus(enum.IntEnum):
    ACL_STREAM_STATUS_COMPLETE = 0
    ACL_STREAM_STATUS_NOT_READY = 1


class EventStatus(enum.IntEnum):
    """aclrtEventStatus (deprecated query_event)."""

    ACL_EVENT_STATUS_COMPLETE = 0
    ACL_EVENT_STATUS_NOT_READY = 1
    ACL_EVENT_STATUS_RESERVED = 2


class EventRecordedStatus(enum.IntEnum):
    """aclrtEventRecordedStatus (query_event_status) — numbering reversed from EventStatus."""

    ACL_EVENT_RECORDED_STATUS_NOT_READY = 0
    ACL_EVENT_RECORDED_STATUS_COMPLETE = 1


class CallbackBlockType(enum.IntEnum):
    ACL_CALLBACK_NO_BLOCK = 0
    ACL_CALLBACK_BLOCK = 1


class RunMode(enum.IntEnum):
    ACL_DEVICE = 0
    ACL_HOST = 1


class DataType(enum.IntEnum):
    ACL_DT_UNDEFINED = -1
    ACL_FLOAT = 0
    ACL_FLOAT16 = 1
    ACL_INT8 = 2
    ACL_INT32 = 3
    ACL_UINT8 = 4
    ACL_INT16 = 6
    ACL_UINT16 = 7
    ACL_UINT32 = 8
    ACL_INT64 = 9
    ACL_UINT64 = 10
    ACL_DOUBLE = 11
    ACL_BOOL = 12
    ACL_STRING = 13
    ACL_COMPLEX64 = 16
    ACL_COMPLEX128 = 17
    ACL_BF16 = 27


class Format(enum.IntEnum):
    ACL_FORMAT_UNDEFINED = -1
    ACL_FORMAT_NCHW = 0
    ACL_FORMAT_NHWC = 1
    ACL_FORMAT_ND = 2


BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

# aclDataType <-> numpy. One spelling: numpy dtypes everywhere on the Python side.
_ACL_TO_NP = {
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
_NP_TO_ACL = {v: k for k, v in _ACL_TO_NP.items()}


# Names people type for dtypes, beyond numpy's own (shared with hccl.types).
DTYPE_ALIASES = {name: np.dtype(t) for name, t in {
    "bf16": BFLOAT16, "bfloat16": BFLOAT16, "fp16": np.float16, "half": np.float16, "fp32": np.float32,
    "float": np.float32, "fp64": np.float64, "double": np.float64}.items()}


def np_dtype(dtype) -> np.dtype:
    """Accept an ACL dtype code, a numpy dtype or a name ('float32', 'bfloat16', 'fp16')."""
    from .errors import AclError

    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        try:
            return _ACL_TO_NP[DataType(int(dtype))]
        except (ValueError, KeyError):
            raise AclError(AclErrorCode.ACL_ERROR_UNSUPPORTED_DATA_TYPE,
                           f"unsupported aclDataType {int(dtype)}") from None
    if isinstance(dtype, str) and dtype.lower() in DTYPE_ALIASES:
        return DTYPE_ALIASES[dtype.lower()]
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise AclError(AclErrorCode.ACL_ERROR_UNSUPPORTED_DATA_TYPE, f"unknown dtype {dtype!r}") from None
    if dt not in _NP_TO_ACL:
        raise AclError(AclErrorCode.ACL_ERROR_UNSUPPORTED_DATA_TYPE,
                       f"dtype {dt} has no aclDataType (supported: {sorted(str(d) for d in _NP_TO_ACL)})")
    return dt


def acl_dtype(dtype) -> DataType:
    return _NP_TO_ACL[np_dtype(dtype)]


def data_type_size(dtype) -> int:
    """Bytes per element, as acl.data_type_size."""
    return np_dtype(dtype).itemsize


# Module-level C-name aliases: rt.ACL_MEMCPY_HOST_TO_DEVICE == 1 and so on.
def _export(*enums) -> dict:
    out = {}
    for e in enums:
        for member in e:
            out[member.name] = member
    return out


C_NAMES = _export(AclErrorCode, MemcpyKind, MemMallocPolicy, MemAttr, StreamStatus, EventStatus,
                  EventRecordedStatus, CallbackBlockType, RunMode, DataType, Format)
C_NAMES.update(ACL_MEM_TYPE_LOW_BAND_WIDTH=ACL_MEM_TYPE_LOW_BAND_WIDTH,
               ACL_MEM_TYPE_HIGH_BAND_WIDTH=ACL_MEM_TYPE_HIGH_BAND_WIDTH,
               ACL_MEM_ACCESS_USER_SPACE_READONLY=ACL_MEM_ACCESS_USER_SPACE_READONLY)
globals().update(C_NAMES)

# Short names used in the DESIGN: rt.HBM, rt.MEM_MALLOC_HUGE_FIRST, ...
HBM = MemAttr.ACL_HBM_MEM
DDR = MemAttr.ACL_DDR_MEM
MEM_MALLOC_HUGE_FIRST = MemMallocPolicy.ACL_MEM_MALLOC_HUGE_FIRST
MEM_MALLOC_HUGE_ONLY = MemMallocPolicy.ACL_MEM_MALLOC_HUGE_ONLY
MEM_MALLOC_NORMAL_ONLY = MemMallocPolicy.ACL_MEM_MALLOC_NORMAL_ONLY
