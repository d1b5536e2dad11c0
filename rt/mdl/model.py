"""The in-memory form of an offline model: what :func:`rt.mdl.format.parse` returns and GraphBuilder builds."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..kernels import registry


@dataclasses.dataclass(frozen=True)
class ValueInfo:
    """A model input or output: name, dtype and shape (-1 marks a dynamic dim)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def spec(self) -> registry.TensorSpec:
        return registry.TensorSpec(self.shape, self.dtype)


@dataclasses.dataclass(frozen=True)
class Node:
    """One operator application: ONNX op type, node name, value names in and out, attributes."""

    op: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict


@dataclasses.dataclass(frozen=True)
class Weight:
    """A constant tensor stored in the file as raw little-endian bytes."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    data: bytes

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def spec(self) -> registry.TensorSpec:
        return registry.TensorSpec(self.shape, self.dtype)

    def array(self) -> np.ndarray:
        """A read-only numpy view of the weight bytes."""
        return np.frombuffer(self.data, dtype=self.dtype).reshape(self.shape)


@dataclasses.dataclass(frozen=True)
class ModelDef:
    """A parsed model. ``nodes`` are in topological order after :func:`parse`."""

    name: str
    inputs: tuple[ValueInfo, ...]
    outputs: tuple[ValueInfo, ...]
    nodes: tuple[Node, ...]
    weights: tuple[Weight, ...]
    batch_sizes: tuple[int, ...] = ()  # dynamic-batch gears; empty = not a dynamic-batch model
    # gears of the -1 dims (values in input order) of an atc --dynamic_image_size / --dynamic_dims model;
    # at most one of batch_sizes, image_sizes, dims is set
    image_sizes: tuple[tuple[int, int], ...] = ()
    dims: tuple[tuple[int, ...], ...] = ()
    # every value's spec at the declared input shapes, as check_graph inferred them (so a loader need
    # not re-run inference for a static model); derived data, not part of the model's identity
    specs: dict | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def weight_bytes(self) -> int:
        return sum(w.nbytes for w in self.weights)
