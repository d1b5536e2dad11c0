"""The legacy tensor types of ``torch.npu`` (``torch.npu.FloatTensor``...), as ``torch.cuda`` has them.

``torch.npu.FloatTensor(2, 3)`` is an uninitialized float32 tensor of that shape on the current npu device,
``torch.npu.FloatTensor([1, 2])`` one with that data, ``torch.npu.FloatTensor()`` an empty one;
``isinstance(t, torch.npu.FloatTensor)`` is True for a float32 tensor on an npu device.
"""

from __future__ import annotations

import torch

from ..distributed.bootstrap import current_device

__all__ = ["BFloat16Tensor", "BoolTensor", "ByteTensor", "CharTensor", "DoubleTensor", "FloatTensor", "HalfTensor",
           "IntTensor", "LongTensor", "ShortTensor"]


class _TensorType(type):
    """The class of a legacy tensor type: construction makes an npu tensor, ``isinstance`` checks device+dtype."""

    dtype: torch.dtype

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.Tensor) and obj.device.type == "npu" and obj.dtype == cls.dtype

    def __call__(cls, *args, device=None):
        where = torch.device("npu", current_device()) if device is None else torch.device(device)
        if where.type != "npu":
            raise RuntimeError(f"legacy constructor expects device type: npu but device type: {where.type} was "
                               f"passed")
        if not args:
            return torch.empty(0, dtype=cls.dtype, device=where)
        if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
            return torch.empty(args, dtype=cls.dtype, device=where)
        if len(args) == 1 and isinstance(args[0], torch.Size):
            return torch.empty(args[0], dtype=cls.dtype, device=where)
        if len(args) == 1:
            return torch.tensor(args[0], dtype=cls.dtype, device=where)
        raise TypeError(f"{cls.__name__}(): expected sizes (ints) or one sequence of data, got "
                        f"{', '.join(type(a).__name__ for a in args)}")

    def __repr__(cls) -> str:
        return f"<class '{cls.__name__}'>"


def _tensor_type(name: str, dtype: torch.dtype) -> _TensorType:
    # named "torch.npu.X" as torch's C tensor types are, so that ``t.type(torch.npu.HalfTensor)`` (which reads the
    # type's name) converts
    return _TensorType(f"torch.npu.{name}", (), {"dtype": dtype, "is_npu": True, "is_sparse": False,
                                                 "__module__": "torch.npu", "__qualname__": name,
                                                 "__doc__": f"{dtype} tensors on an npu device."})


BoolTensor = _tensor_type("BoolTensor", torch.bool)
ByteTensor = _tensor_type("ByteTensor", torch.uint8)
CharTensor = _tensor_type("CharTensor", torch.int8)
ShortTensor = _tensor_type("ShortTensor", torch.int16)
IntTensor = _tensor_type("IntTensor", torch.int32)
LongTensor = _tensor_type("LongTensor", torch.int64)
HalfTensor = _tensor_type("HalfTensor", torch.float16)
FloatTensor = _tensor_type("FloatTensor", torch.float32)
DoubleTensor = _tensor_type("DoubleTensor", torch.float64)
BFloat16Tensor = _tensor_type("BFloat16Tensor", torch.bfloat16)
