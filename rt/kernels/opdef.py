"""What a built-in op is (``OpDef``: ONNX name, shape inference, compute; ``TensorSpec``), and the table the
op modules register into as they are imported (``library.py`` imports them all; ``registry.py`` looks ops up).

Shape inference runs on the host (eager ops allocate their outputs from it, ``GraphBuilder``
checks models with it); ``compute`` runs inside the card over numpy views of card memory and
writes its outputs in place. User kernels (``@rt.kernel``) are registered per card at run time
and do not live here.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from ..constants import AclErrorCode
from ..errors import AclError


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of a tensor; a dim of -1 is dynamic (unknown until run time)."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @property
    def nbytes(self) -> int:
        if any(d < 0 for d in self.shape):
            raise AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM, f"size of dynamic shape {self.shape} is unknown")
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class OpDef:
    """One built-in operator.

    - ``name``: ONNX operator name ("MatMul"); ``snake``: eager name under ``rt.ops`` ("mat_mul"
      is wrong, use the conventional "matmul"; "layer_normalization" → "layer_norm" is fine).
    - ``infer(specs, attrs) -> list[TensorSpec]``: output specs from input specs, raising
      ``AclError`` (100026 unsupported dtype, 100000 bad shapes/attrs) with a message naming the op,
      the argument and what was expected. Must accept -1 (dynamic) dims.
    - ``compute(inputs, outputs, attrs) -> None``: numpy arrays (views of card memory) in, results
      written into ``outputs`` in place (``outputs[i][...] = ...``).
    - ``inplace``: indices of inputs that ``compute`` updates in place (optimizer steps); such ops
      may have zero outputs.
    """

    name: str
    snake: str
    infer: Callable[[list[TensorSpec], dict], list[TensorSpec]]
    compute: Callable[[list[np.ndarray], list[np.ndarray], dict], None]
    min_inputs: int = 1
    max_inputs: int = 1
    inplace: tuple[int, ...] = ()
    doc: str = ""


REGISTRY: dict[str, OpDef] = {}
BY_SNAKE: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in REGISTRY or op.snake in BY_SNAKE:
        raise ValueError(f"op {op.name}/{op.snake} registered twice")
    REGISTRY[op.name] = op
    BY_SNAKE[op.snake] = op
    return op
