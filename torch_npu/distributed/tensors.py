"""torch tensors as HCCL buffers: dtypes, and copies to and from the card.

A tensor's bytes are copied into the group's scratch device buffer, the collective runs on the card between
card buffers (npusim's HCCL with all its checks), and the result is copied back into the tensor's own memory.
An ``npu`` tensor is read and written through a CPU view of its bytes when torch_npu provides one
(``torch_npu.storage.cpu_view``), else through a CPU copy; a CPU tensor (the backend's own temporaries)
directly.
"""

from __future__ import annotations

import torch

import rt
from hccl.types import HcclDataType as D

# torch_npu's ScalarType → HcclDataType map (HCCLUtils.cpp); bool travels as uint8.
DTYPES = {torch.uint8: D.UINT8, torch.int8: D.INT8, torch.int16: D.INT16, torch.int32: D.INT32,
          torch.int64: D.INT64, torch.float16: D.FP16, torch.float32: D.FP32, torch.uint16: D.UINT16,
          torch.uint32: D.UINT32, torch.uint64: D.UINT64, torch.float64: D.FP64, torch.bool: D.UINT8,
          torch.bfloat16: D.BFP16}
# How torch_npu names them in "Unsupported data type" errors (getHcclDataTypeSerialString).
SERIAL = {torch.uint8: "at::kByte/at::kBool", torch.bool: "at::kByte/at::kBool", torch.int8: "at::kChar",
          torch.int16: "at::kShort", torch.int32: "at::kInt", torch.int64: "at::kLong",
          torch.float16: "at::kHalf", torch.float32: "at::kFloat", torch.float64: "at::kDouble",
          torch.bfloat16: "at::kBFloat16", torch.uint16: "at::ScalarType::UInt16",
          torch.uint32: "at::ScalarType::UInt32", torch.uint64: "at::ScalarType::UInt64"}
H2D, D2H = rt.ACL_MEMCPY_HOST_TO_DEVICE, rt.ACL_MEMCPY_DEVICE_TO_HOST


def hccl_dtype(t: torch.Tensor) -> D:
    """The HCCL dtype of a tensor already checked by ``checks.dtype``."""
    return DTYPES[t.dtype]


def _cpu_view(t: torch.Tensor):
    """A CPU tensor on ``t``'s own bytes, or None when it has none (then it is copied)."""
    if t.device.type == "cpu":
        return t.detach()
    try:
        from ..storage import cpu_view
    except ImportError:
        return None
    return cpu_view(t)                          # reads the storage: no autograd, no dispatched op (as detach is)


def host_bytes(t: torch.Tensor):
    """The tensor's elements in logical order as a flat uint8 numpy array: its own memory when it is contiguous
    and has a CPU view, else a copy."""
    view = _cpu_view(t)
    if view is None:
        view = t.detach().cpu()
    return view.contiguous().reshape(-1).view(torch.uint8).numpy()


def upload(ex, role: str, tensors) -> int:
    """Queue H2D copies of ``tensors`` back to back into the executor's ``role`` buffer; returns the buffer."""
    total = sum(t.numel() * t.element_size() for t in tensors)
    ptr = ex.buffer(role, total)
    at = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        if n:
            rt.memcpy_async(ptr + at, n, host_bytes(t), n, H2D, ex.stream)
        at += n
    return ptr


def download(ex, ptr: int, tensors) -> None:
    """Copy from ``ptr`` back to back into ``tensors`` (waiting for the stream)."""
    at, copies = 0, []
    for t in tensors:
        n = t.numel() * t.element_size()
        if n:
            view = _cpu_view(t) if t.is_contiguous() else None
            if view is None:                        # no flat view of its bytes: through a CPU copy
                view = torch.empty(t.shape, dtype=t.dtype)
                copies.append((t, view))
            rt.memcpy_async(view.reshape(-1).view(torch.uint8).numpy(), n, ptr + at, n, D2H, ex.stream)
        at += n
    rt.synchronize_stream(ex.stream)
    for t, view in copies:
        t.copy_(view)
