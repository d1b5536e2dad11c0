"""``aclTensorDesc`` as pyACL has it at ``acl``'s root: ``create_tensor_desc(data_type, dims, format)``, its
getters and setters, ``destroy_tensor_desc``. Single-operator execution (``acl/_op.py``) describes every input
and output with one.

A desc is an int handle. Its dims are checked as aclCreateTensorDesc checks them (at most 64, each >= 0 or
-1 for "unknown until run time"; -2 alone is an unknown rank). Formats are aclFormat codes: the plain
layouts (ND, NCHW, NHWC, NC, NCL, NCDHW, NDHWC, HWCN) describe row-major data of the dims given, which is all
npusim's ONNX-named kernels take; the AI Core's blocked layouts (NC1HWC0, FRACTAL_Z, FRACTAL_NZ ...) are
known codes a desc may carry, refused when an operator is executed with them (``ACL_ERROR_FORMAT_NOT_MATCH``).
"""

from __future__ import annotations

import math

import numpy as np

from rt import args
from rt.constants import AclErrorCode as E
from rt.constants import DataType
from rt.dtypes import ACL_TO_NP
from rt.errors import AclError

from ._core import HANDLES, code, plain, values

TENSOR_DESC = "tensor desc"
ACL_MAX_DIM_CNT = 128                      # acl_base.h
ACL_UNKNOWN_RANK = 0xFFFFFFFFFFFFFFFE      # get_tensor_desc_num_dims of a desc created with dims [-2]
UNKNOWN_DIM, UNKNOWN_RANK_DIM = -1, -2
# aclFormat (acl_base.h): the plain layouts npusim's kernels take, and the AI Core's blocked ones
PLAIN_FORMATS = {0: "NCHW", 1: "NHWC", 2: "ND", 16: "HWCN", 27: "NDHWC", 30: "NCDHW", 35: "NC", 47: "NCL"}
BLOCKED_FORMATS = {3: "NC1HWC0", 4: "FRACTAL_Z", 12: "NC1HWC0_C04", 29: "FRACTAL_NZ", 32: "NDC1HWC0",
                   33: "FRACTAL_Z_3D"}
FORMATS = {-1: "UNDEFINED", **PLAIN_FORMATS, **BLOCKED_FORMATS}
# aclMemType: where a tensor's buffer lives (set_tensor_place_ment)
ACL_MEMTYPE_DEVICE, ACL_MEMTYPE_HOST, ACL_MEMTYPE_HOST_COMPILE_INDEPENDENT = 0, 1, 2


class TensorDesc:
    """What ``create_tensor_desc`` makes."""

    def __init__(self, acl_dtype: int, dims: list[int], fmt: int):
        self.acl_dtype, self.dims, self.format = acl_dtype, dims, fmt
        self.name = ""
        self.storage_format, self.storage_dims = fmt, list(dims)
        self.placement = ACL_MEMTYPE_DEVICE
        self.const: bytes | None = None

    @property
    def dtype(self) -> np.dtype:
        return ACL_TO_NP[DataType(self.acl_dtype)]

    @property
    def unknown_rank(self) -> bool:
        return self.dims == [UNKNOWN_RANK_DIM]

    @property
    def static(self) -> bool:
        return all(d >= 0 for d in self.dims)

    def element_count(self) -> int:
        return math.prod(self.dims) if self.static else 0

    def nbytes(self) -> int:
        return self.element_count() * self.dtype.itemsize if self.acl_dtype >= 0 else 0

    def describe(self) -> str:
        dtype = self.dtype if self.acl_dtype >= 0 else "undefined"
        return f"{dtype}{self.dims} {FORMATS.get(self.format, self.format)}"


# descs a dataset owns (acl.mdl.set_dataset_tensor_desc, or an output's dims after an execution):
# dataset handle -> index -> desc handle; dropped with the dataset (acl.mdl.destroy_dataset)
DATASET_DESCS: dict[int, dict[int, int]] = {}


def own_desc(dataset: int, index: int, desc: TensorDesc) -> int:
    """Give ``dataset`` a desc at ``index`` (replacing the one it had); returns the desc's handle."""
    owned = DATASET_DESCS.setdefault(dataset, {})
    old = owned.get(index)
    if old is not None:
        HANDLES.drop(old)
    owned[index] = HANDLES.add(TENSOR_DESC, desc)
    return owned[index]


def drop_dataset_descs(dataset: int) -> None:
    for h in DATASET_DESCS.pop(dataset, {}).values():
        HANDLES.drop(h)


def desc_of(h, call: str) -> TensorDesc:
    return HANDLES.get(h, TENSOR_DESC, call, "a tensor desc (acl.create_tensor_desc)")


def _data_type(data_type, call: str) -> int:
    """An aclDataType npusim has, or ACL_DT_UNDEFINED (-1): CANN's marker of an unused optional input."""
    if args.is_int(data_type) and data_type == DataType.ACL_DT_UNDEFINED:
        return int(data_type)
    if not args.is_int(data_type) or int(data_type) not in DataType._value2member_map_ or \
            DataType(int(data_type)) not in ACL_TO_NP:
        raise AclError(E.ACL_ERROR_UNSUPPORTED_DATA_TYPE, f"{call}: data_type {args.shown(data_type)} is not an "
                                                          f"aclDataType npusim has (codes: "
                                                          f"{sorted(int(d) for d in ACL_TO_NP)})")
    return int(data_type)


def _format(fmt, call: str) -> int:
    if not args.is_int(fmt) or int(fmt) not in FORMATS:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: format {args.shown(fmt)} is not an aclFormat "
                                                  f"(known: {sorted(FORMATS)})")
    return int(fmt)


def _dims(dims, call: str) -> list[int]:
    if isinstance(dims, np.ndarray) and dims.ndim == 1 and dims.dtype.kind in "iu":
        dims = dims.tolist()
    if isinstance(dims, tuple):
        dims = list(dims)
    dims = args.int_list(dims, call, "dims", lo=UNKNOWN_RANK_DIM)
    if len(dims) > ACL_MAX_DIM_CNT:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {len(dims)} dims, at most {ACL_MAX_DIM_CNT}")
    if UNKNOWN_RANK_DIM in dims and dims != [UNKNOWN_RANK_DIM]:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: dims {dims}: -2 (unknown rank) must be the only dim")
    if all(d >= 0 for d in dims) and math.prod(dims) > args.INT64_MAX:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: dims {dims} hold more elements than an int64 counts")
    return dims


@plain("create_tensor_desc", 0)
def create_tensor_desc(data_type, dims, format):
    call = "create_tensor_desc"
    return HANDLES.add(TENSOR_DESC, TensorDesc(_data_type(data_type, call), _dims(dims, call), _format(format, call)))


@plain("destroy_tensor_desc", None)
def destroy_tensor_desc(desc):
    """Nothing is returned (aclDestroyTensorDesc is void); a bad handle is recorded for get_recent_err_msg."""
    desc_of(desc, "destroy_tensor_desc")
    HANDLES.drop(desc)


def _getter(call: str, default, fn):
    @plain(call, default)
    def get(desc):
        return fn(desc_of(desc, call))
    get.__name__ = call
    get.__doc__ = f"``acl.{call}(desc)`` (a bare value; {default!r} for a bad desc, as pyACL's C getter gives)."
    return get


get_tensor_desc_type = _getter("get_tensor_desc_type", int(DataType.ACL_DT_UNDEFINED), lambda d: d.acl_dtype)
get_tensor_desc_format = _getter("get_tensor_desc_format", -1, lambda d: d.format)
get_tensor_desc_size = _getter("get_tensor_desc_size", 0, TensorDesc.nbytes)
get_tensor_desc_element_count = _getter("get_tensor_desc_element_count", 0, TensorDesc.element_count)
get_tensor_desc_num_dims = _getter("get_tensor_desc_num_dims", 0,
                                   lambda d: ACL_UNKNOWN_RANK if d.unknown_rank else len(d.dims))
get_tensor_desc_name = _getter("get_tensor_desc_name", "", lambda d: d.name)


def _dim(d: TensorDesc, index, call: str) -> int:
    if d.unknown_rank:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: the desc has an unknown rank (dims [-2])")
    if not args.is_int(index) or not 0 <= index < len(d.dims):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: index {args.shown(index)} out of range, the desc has "
                                                  f"{len(d.dims)} dims")
    return d.dims[int(index)]


@plain("get_tensor_desc_dim", -1)
def get_tensor_desc_dim(desc, index):
    """Deprecated in pyACL (use get_tensor_desc_dim_v2): the bare dim, -1 on failure."""
    return _dim(desc_of(desc, "get_tensor_desc_dim"), index, "get_tensor_desc_dim")


@values("get_tensor_desc_dim_v2", -1)
def get_tensor_desc_dim_v2(desc, index):
    return _dim(desc_of(desc, "get_tensor_desc_dim_v2"), index, "get_tensor_desc_dim_v2")


@plain("set_tensor_desc_name", None)
def set_tensor_desc_name(desc, name):
    desc_of(desc, "set_tensor_desc_name").name = args.text(name, "set_tensor_desc_name", "name")


@code("set_tensor_shape")
def set_tensor_shape(desc, dims):
    d = desc_of(desc, "set_tensor_shape")
    d.dims = _dims(dims, "set_tensor_shape")
    d.storage_dims = list(d.dims)


@code("set_tensor_format")
def set_tensor_format(desc, format):
    desc_of(desc, "set_tensor_format").format = _format(format, "set_tensor_format")


@code("set_tensor_storage_format")
def set_tensor_storage_format(desc, format):
    """Recorded; npusim's kernels read the data in the desc's own (plain) format."""
    desc_of(desc, "set_tensor_storage_format").storage_format = _format(format, "set_tensor_storage_format")


@code("set_tensor_storage_shape")
def set_tensor_storage_shape(desc, dims):
    desc_of(desc, "set_tensor_storage_shape").storage_dims = _dims(dims, "set_tensor_storage_shape")


@code("set_tensor_place_ment")
def set_tensor_place_ment(desc, mem_type):
    """pyACL's spelling of aclSetTensorPlaceMent: where the tensor's buffer lives (0 device, 1 host, 2 host
    compile-independent). A host-placed input is read from host memory at execution."""
    d = desc_of(desc, "set_tensor_place_ment")
    if not args.is_int(mem_type) or int(mem_type) not in (ACL_MEMTYPE_DEVICE, ACL_MEMTYPE_HOST,
                                                          ACL_MEMTYPE_HOST_COMPILE_INDEPENDENT):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"set_tensor_place_ment: mem_type {args.shown(mem_type)} is not "
                                                  f"0 (device), 1 (host) or 2 (host, compile-independent)")
    d.placement = int(mem_type)


__all__ = ["create_tensor_desc", "destroy_tensor_desc", "get_tensor_desc_dim", "get_tensor_desc_dim_v2",
           "get_tensor_desc_element_count", "get_tensor_desc_format", "get_tensor_desc_name",
           "get_tensor_desc_num_dims", "get_tensor_desc_size", "get_tensor_desc_type", "set_tensor_desc_name",
           "set_tensor_format", "set_tensor_place_ment", "set_tensor_shape", "set_tensor_storage_format",
           "set_tensor_storage_shape"]
