"""torch tensors as HCCL buffers: dtypes, reduce ops, argument checks, and copies to and from the card.

A tensor's bytes are copied into the group's scratch device buffer, the collective runs on the card between
card buffers (npusim's HCCL with all its checks), and the result is copied back into the tensor's own memory.
The checks here run in the caller's thread, before anything is queued, and raise what c10d raises for the
same mistake (``ValueError`` / ``RuntimeError`` naming the tensor and the sizes).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import rt

from hccl.types import HcclDataType as D, HcclReduceOp

DTYPES = {torch.float32: D.FP32, torch.float16: D.FP16, torch.bfloat16: D.BFP16, torch.float64: D.FP64,
          torch.int8: D.INT8, torch.int16: D.INT16, torch.int32: D.INT32, torch.int64: D.INT64, torch.uint8: D.UINT8,
          torch.uint16: D.UINT16, torch.uint32: D.UINT32, torch.uint64: D.UINT64, torch.bool: D.UINT8}
REDUCE = {dist.ReduceOp.SUM: HcclReduceOp.SUM, dist.ReduceOp.PRODUCT: HcclReduceOp.PROD,
          dist.ReduceOp.MIN: HcclReduceOp.MIN, dist.ReduceOp.MAX: HcclReduceOp.MAX}
H2D, D2H = rt.ACL_MEMCPY_HOST_TO_DEVICE, rt.ACL_MEMCPY_DEVICE_TO_HOST


def hccl_dtype(t: torch.Tensor, op: str) -> D:
    code = DTYPES.get(t.dtype)
    if code is None:
        raise ValueError(f"hccl {op}: unsupported dtype {t.dtype} (HCCL moves {', '.join(sorted(str(d)[6:] for d in DTYPES))})")
    return code


def reduce_op(rop, t: torch.Tensor, op: str) -> tuple[HcclReduceOp, bool]:
    """(HCCL's op, divide by world size afterwards) for a c10d ReduceOp; AVG is SUM then a division."""
    if rop == dist.ReduceOp.AVG:
        if not (t.dtype.is_floating_point or t.dtype.is_complex):
            raise ValueError(f"hccl {op}: ReduceOp.AVG needs a floating-point tensor, got {t.dtype}")
        return HcclReduceOp.SUM, True
    for c10d_op, code in REDUCE.items():
        if rop == c10d_op:
            if t.dtype == torch.bool and code in (HcclReduceOp.SUM, HcclReduceOp.PROD):
                return (HcclReduceOp.MAX if code == HcclReduceOp.SUM else HcclReduceOp.MIN), False   # or / and
            return code, False
    name = getattr(getattr(rop, "op", rop), "name", str(rop))
    raise ValueError(f"hccl {op}: ReduceOp.{name} is not supported: HCCL reduces with SUM, PRODUCT, MIN and MAX "
                     f"(and AVG, done as SUM / world size)")


def single(tensors, op: str) -> torch.Tensor:
    """The one tensor of a c10d tensor list (HCCL, like NCCL, takes one tensor per process)."""
    if not isinstance(tensors, (list, tuple)) or len(tensors) != 1:
        raise ValueError(f"hccl {op}: expecting exactly one tensor, got {len(tensors) if isinstance(tensors, (list, tuple)) else tensors!r}")
    return check(tensors[0], op, "tensor")


def check(t, op: str, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"hccl {op}: {what} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        raise ValueError(f"hccl {op}: Tensors must be contiguous ({what} has shape {list(t.shape)}, strides "
                         f"{list(t.stride())})")
    if t.device.type != "cpu":
        raise ValueError(f"hccl {op}: {what} is on {t.device}; npusim's npu tensors are CPU tensors (docs/torch.md)")
    hccl_dtype(t, op)
    return t


def same_as(tensors, like: torch.Tensor, n: int, op: str, what: str) -> list:
    """A list of ``n`` tensors each of ``like``'s dtype and element count (c10d's scatter/gather list rule)."""
    if not isinstance(tensors, (list, tuple)) or len(tensors) != n:
        got = len(tensors) if isinstance(tensors, (list, tuple)) else type(tensors).__name__
        raise ValueError(f"hccl {op}: {what} has {got} tensors; it must have one per rank of the group ({n}) — "
                         f"Tensor list input to scatter/gather must match number of collective participants")
    for i, t in enumerate(tensors):
        check(t, op, f"{what}[{i}]")
        if t.dtype != like.dtype or t.numel() != like.numel():
            raise ValueError(f"hccl {op}: {what}[{i}] is {t.dtype}[{t.numel()}] but the tensor is "
                             f"{like.dtype}[{like.numel()}]: all tensor operands must have the same type and number "
                             f"of elements")
    return list(tensors)


def host_bytes(t: torch.Tensor):
    """The tensor's memory as a flat uint8 numpy array (shared, not copied)."""
    return t.detach().reshape(-1).view(torch.uint8).numpy()


def upload(ex, role: str, tensors, offset_bytes: int = 0) -> int:
    """Queue H2D copies of ``tensors`` back to back into the executor's ``role`` buffer; returns the buffer."""
    total = offset_bytes + sum(t.numel() * t.element_size() for t in tensors)
    ptr = ex.buffer(role, total)
    at = offset_bytes
    for t in tensors:
        n = t.numel() * t.element_size()
        if n:
            rt.memcpy_async(ptr + at, n, host_bytes(t), n, H2D, ex.stream)
        at += n
    return ptr


def download(ex, ptr: int, tensors) -> None:
    """Queue D2H copies from ``ptr`` back to back into ``tensors``, then wait for the stream."""
    at = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        if n:
            rt.memcpy_async(host_bytes(t), n, ptr + at, n, D2H, ex.stream)
        at += n
    rt.synchronize_stream(ex.stream)
