"""ProcessGroupHCCL's argument checks (torch_npu ``ProcessGroupHCCL.cpp``), with its exception types and texts.

They run in the calling thread before anything is queued: ``RuntimeError`` for its ``TORCH_CHECK`` failures
(``Tensors must be contiguous``, ``Tensors must be NPU and dense``, ``HCCL allreduce: Unsupported data type
at::kDouble``, ``Cannot use ReduceOp.BAND with HCCL``, ``Corresponding input/output tensors to reduce_scatter
must all reside on the same device`` ...), ``ValueError`` for gather/scatter's ``invalidArgument``. Each ends
with torch_npu's error-code line (``errors.dist_error``).

Only ``npu`` tensors are NPU tensors. A call whose tensors are all CPU tensors never gets here: ``routing.py``
hands it to the group's gloo or refuses it with c10d's ``No backend type associated with device type cpu``; a CPU
tensor next to npu ones fails ``Tensors must be NPU and dense``, as in ProcessGroupHCCL.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import rt

from .errors import NOT_FOUND, NOT_SUPPORT, PARAM, TYPE, VALUE, fail
from .tensors import DTYPES, SERIAL

# Reductions HCCL has no kernel for on every SoC (checkSupportedDataType); Ascend950 adds uint64 and fp64.
REDUCIBLE = {torch.int8, torch.int16, torch.int32, torch.float16, torch.float32, torch.bfloat16, torch.int64}
REDUCIBLE_A5 = {torch.uint64, torch.float64}
PREMUL_DTYPES = {torch.float16, torch.float32, torch.bfloat16, torch.float64}
_UNSUPPORTED_OPS = {dist.ReduceOp.BAND: "BAND", dist.ReduceOp.BOR: "BOR", dist.ReduceOp.BXOR: "BXOR"}
_HCCL_OPS = (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX)
BASE_FORMATS = {0, 1, 2, 30}            # ACL NCHW, NHWC, ND, NCDHW: FormatHelper::IsBaseFormatType


def npu_is_real() -> bool:
    """Whether ``npu`` tensors are their own device type (PrivateUse1 named ``npu`` with kernels behind it)."""
    if torch._C._get_privateuse1_backend_name() != "npu":
        return False
    key = torch._C.DispatchKey.PrivateUse1
    return (torch._C._dispatch_has_backend_fallback(key)
            or torch._C._dispatch_has_kernel_for_dispatch_key("aten::empty.memory_format", "PrivateUse1"))


def is_npu(t: torch.Tensor) -> bool:
    """A tensor on the ``npu`` device."""
    return t.device.type == "npu"


def _dense_npu(t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"hccl: expected a torch.Tensor, got {type(t).__name__}")
    if not is_npu(t) or t.is_sparse:
        fail("Tensors must be NPU and dense", TYPE)


def _contiguous(t: torch.Tensor) -> bool:
    """Contiguous in its suggested memory format (``torch.contiguous_format`` or channels-last)."""
    return (t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last))
            or (t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d)))


def _non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """Some permutation of the dimensions is contiguous (c10's ``is_non_overlapping_and_dense``)."""
    expected = 1
    for d in sorted(range(t.dim()), key=lambda d: (t.stride(d), t.shape[d])):
        if t.shape[d] == 1:
            continue
        if t.stride(d) != expected:
            return False
        expected *= t.shape[d]
    return True


def _base_format_or_no_offset(t: torch.Tensor) -> None:
    """A tensor cast to an internal storage format (``torch_npu.npu_format_cast``) must start its storage."""
    try:
        from ..formats import get_npu_format
    except ImportError:
        return
    if int(get_npu_format(t)) not in BASE_FORMATS and t.storage_offset() != 0:
        fail("For a tensor of internal format, it's storage_offset must be 0", NOT_SUPPORT)


def single(t: torch.Tensor) -> torch.Tensor:
    """``check_npu_single_tensor``."""
    _dense_npu(t)
    if not _contiguous(t):
        fail("Tensors must be contiguous", TYPE)
    _base_format_or_no_offset(t)
    return t


def one_per_process(tensors) -> torch.Tensor:
    """``check_npu_tensors_different_devices``: the one tensor of a c10d tensor list (one NPU per process)."""
    if len(tensors) == 0:
        fail("Tensor list must be nonempty", PARAM)
    if len(tensors) != 1:
        fail("Tensor list mustn't be larger than the number of available NPUs", VALUE)
    return single(tensors[0])


def same_device(tensors) -> list:
    """``check_npu_tensors_same_device``: one dtype, one device, each non-overlapping and dense."""
    if len(tensors) == 0:
        fail("Tensor list must be nonempty", PARAM)
    first = tensors[0]
    for t in tensors:
        _dense_npu(t)
        if t.dtype != first.dtype:
            fail("Tensors must have identical type", TYPE)
        if not _non_overlapping_and_dense(t):
            fail("Tensors must be non-overlapping and dense", TYPE)
        if t.device != first.device:
            fail("Tensors must be on same NPU device", TYPE)
        _base_format_or_no_offset(t)
    return list(tensors)


def dtype(t: torch.Tensor) -> None:
    """``getHcclDataType``: a dtype HCCL can move."""
    if t.dtype not in DTYPES:
        fail("Unsupported data type for HCCL process group", NOT_SUPPORT)


def reducible(t: torch.Tensor, function: str) -> None:
    """``checkSupportedDataType`` (``function`` as torch_npu's C++ names it, e.g. ``allreduce``)."""
    dtype(t)
    a5 = rt.is_initialized() and rt.get_soc_name() >= "Ascend950"
    if t.dtype not in REDUCIBLE and not (a5 and t.dtype in REDUCIBLE_A5):
        fail(f"HCCL {function}: Unsupported data type {SERIAL[t.dtype]}", NOT_SUPPORT)


def reduce_op(rop, t: torch.Tensor) -> None:
    """``getHcclReduceOp``: AVG (SUM, then a division) and PREMUL_SUM (a scaling, then SUM) are torch_npu's own."""
    if rop == dist.ReduceOp.AVG or any(rop == op for op in _HCCL_OPS):
        return
    if rop == dist.ReduceOp.PREMUL_SUM:
        if t.dtype not in PREMUL_DTYPES:
            fail("PreMulSum Data type must be half, float, bfloat16 or double", TYPE)
        return
    for op, name in _UNSUPPORTED_OPS.items():
        if rop == op:
            fail(f"Cannot use ReduceOp.{name} with HCCL", NOT_SUPPORT)
    fail("Unhandled ReduceOp", NOT_FOUND)


def reduce_scatter_devices(inputs, output: torch.Tensor) -> None:
    """``flatten_for_reduce_scatter``: the input list is non-empty and on the output's device."""
    if not inputs:
        fail("Tensor list operands to reduce_scatter must be non-empty", PARAM)
    if inputs[0].device != output.device:
        fail("Corresponding input/output tensors to reduce_scatter must all reside on the same device", PARAM)


def gather_list(outputs, inp: torch.Tensor, size: int) -> None:
    """``flatten_for_scatter_gather``: one tensor per rank, on the input's device, of its element count."""
    if len(outputs) != size:
        fail("Tensor list input to scatter/gather must match number of collective participants", PARAM)
    if outputs[0].device != inp.device:
        fail("Corresponding input/output tensors to scatter/gather must all reside on the same device", PARAM)
    for t in outputs:
        if t.numel() != inp.numel():
            fail("All tensor operands to scatter/gather must have the same size", PARAM)


def root_list(tensor_lists, like: torch.Tensor, size: int, rank: int, root: int, op: str, what: str) -> list:
    """gather's outputs / scatter's inputs (``c10d::assert*`` with ``ProcessGroupHCCL::<op>: `` ValueErrors):
    one list of ``size`` tensors like ``like`` on the root, none elsewhere."""
    def invalid(msg):
        fail(f"ProcessGroupHCCL::{op}: {msg}", PARAM, ValueError)
    if not 0 <= root < size:
        invalid(f"invalid root rank: {root}")
    if rank != root:
        if len(tensor_lists) != 0:
            invalid(f"requires empty {what} on non-root")
        return []
    if len(tensor_lists) != 1:
        invalid(f"requires a single-element {what} list containing a list with {size} tensors.")
    if len(tensor_lists[0]) != size:
        invalid(f"Incorrect {what} list size {len(tensor_lists[0])}. {what.capitalize()} list size should be {size}, "
                f"same as size of the process group.")
    for i, t in enumerate(tensor_lists[0]):
        single(t)
        if t.dtype != like.dtype or t.device != like.device:
            invalid(f"invalid tensor type at index {i} (expected {like.dtype} on {like.device}, got {t.dtype} on "
                    f"{t.device})")
        if t.shape != like.shape:
            invalid(f"invalid tensor size at index {i} (expected {list(like.shape)}, got {list(t.shape)})")
    return list(tensor_lists[0])


def splits(t: torch.Tensor, split_sizes, size: int) -> list[int]:
    """Rows per rank of ``all_to_all_single`` (``check_split_sizes``), even when none are given."""
    if t.dim() < 1:
        fail(f"Scalar tensors (0-dim tensors) are not supported in alltoall. tensor.dim()={t.dim()}. Please reshape "
             f"tensors to at least 1-D before calling alltoall.", NOT_SUPPORT)
    rows = t.shape[0]
    if not split_sizes:
        if rows % size:
            fail("Tensor's dim 0 does not divide equally across group size", PARAM)
        return [rows // size] * size
    split_sizes = [int(s) for s in split_sizes]
    if len(split_sizes) != size:
        fail("Number of tensor splits not equal to group size", TYPE)
    if sum(split_sizes) != rows or min(split_sizes) < 0:
        fail("Split sizes doesn't match total dim 0 size", TYPE)
    return split_sizes
