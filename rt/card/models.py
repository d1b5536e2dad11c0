"""Card side of offline models: the models loaded on one card, their weights in card memory.

The card wires these to its commands: sync ``model_load(data)`` / ``model_unload(id)`` and the
stream task ``model_execute(id, inputs, outputs, dynamic)``. Model ids are never reused, so a
stale id is always reported as invalid.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..constants import AclErrorCode
from ..dtypes import acl_dtype
from ..errors import AclError
from ..mdl import format as fmt, limits
from ..mdl.shapes import dynamic_from_wire, infer_shapes, max_input_shapes, resolve_input_shapes
from .executor import Executor


def _io_desc(info: fmt.ValueInfo, shape) -> dict:
    size = 0 if shape is None else math.prod(shape) * info.dtype.itemsize
    return {"name": info.name, "dtype": str(info.dtype), "acl_dtype": int(acl_dtype(info.dtype)),
            "dims": list(info.shape), "size": size}


def describe(model: fmt.ModelDef, capacity: int | None = None) -> dict:
    """The msgpack-able description the host's ``get_desc`` serves.

    ``dims`` are the declared dims (-1 for dynamic ones); ``size`` is what the host must allocate:
    the size at the largest batch gear for a dynamic-batch model, 0 when a dim is unbounded.
    With ``capacity`` (the card's HBM bytes), a model whose inputs, outputs or intermediates at
    those shapes cannot fit the card is refused here, before any size reaches the wire.
    """
    in_shapes = max_input_shapes(model)
    declared = [v.shape for v in model.inputs]
    try:  # unbounded dims: the symbolic shapes (-1 counts as 1 in the capacity check)
        if model.specs is not None and in_shapes in (None, declared):
            specs = model.specs  # what parse inferred at exactly these shapes
        else:
            specs = infer_shapes(model, in_shapes if in_shapes is not None else declared)
    except AclError as exc:  # e.g. a fixed Reshape that only fits some of the gears
        raise AclError(AclErrorCode.ACL_ERROR_PARSE_MODEL,
                       f"parse model: model {model.name!r} cannot run at its largest input shapes "
                       f"{[list(s) for s in in_shapes or ()]}: {exc.message}") from None
    if capacity is not None:
        limits.check_fits_card(model, specs, capacity, fmt._fail)
    out_shapes = None if in_shapes is None else [specs[v.name].shape for v in model.outputs]
    return {
        "name": model.name,
        "inputs": [_io_desc(v, None if in_shapes is None else in_shapes[i]) for i, v in enumerate(model.inputs)],
        "outputs": [_io_desc(v, None if out_shapes is None else out_shapes[i]) for i, v in enumerate(model.outputs)],
        "batch_sizes": list(model.batch_sizes),
        "weight_bytes": model.weight_bytes,
    }


class _Loaded:
    def __init__(self, model: fmt.ModelDef, owner, ptrs: list[int], executor: Executor):
        self.model, self.owner, self.ptrs, self.executor = model, owner, ptrs, executor


class ModelStore:
    """All models loaded on one card; weights live in the card's ``DeviceMemory``."""

    def __init__(self, memory):
        self.memory = memory
        self._models: dict[int, _Loaded] = {}
        self._ids = itertools.count(1)

    def load(self, data: bytes, owner) -> tuple[int, dict]:
        """Parse, copy the weights into card memory, return ``(model_id, desc)``."""
        model = fmt.parse(data)
        desc = describe(model, self.memory.capacity)
        ptrs: list[int] = []
        weights: dict[str, np.ndarray] = {}
        try:
            for w in model.weights:
                if w.nbytes == 0:  # nothing to store; device malloc of 0 bytes is invalid
                    weights[w.name] = w.array()
                    continue
                ptr = self.memory.malloc(w.nbytes, owner=owner)
                ptrs.append(ptr)
                view = self.memory.typed_view(ptr, w.shape, w.dtype, what=f"model {model.name!r} weight {w.name!r}")
                view[...] = w.array()
                weights[w.name] = view
        except BaseException:
            for ptr in ptrs:  # a model that does not fit leaves nothing behind
                self.memory.free(ptr, owner=owner)
            raise
        model_id = next(self._ids)
        self._models[model_id] = _Loaded(model, owner, ptrs, Executor(model, weights, max_bytes=self.memory.capacity))
        return model_id, desc

    def _get(self, model_id, owner=None, what: str = "execute") -> _Loaded:
        loaded = self._models.get(model_id) if isinstance(model_id, int) else None
        if loaded is None or (owner is not None and loaded.owner != owner):
            raise AclError(AclErrorCode.ACL_ERROR_INVALID_MODEL_ID,
                           f"model {what}: model id {model_id!r} is not loaded on this card"
                           + (" by this process" if loaded is not None else ""))
        return loaded

    def unload(self, model_id: int, owner) -> None:
        """Free the model's weights; the id becomes invalid for good."""
        loaded = self._get(model_id, owner, "unload")
        del self._models[model_id]
        for ptr in loaded.ptrs:
            self.memory.free(ptr, owner=owner)

    def release_owner(self, owner) -> None:
        """Unload every model of a process that went away."""
        for model_id in [i for i, m in self._models.items() if m.owner == owner]:
            self.unload(model_id, owner)

    def model_ids(self, owner=None) -> list[int]:
        return [i for i, m in self._models.items() if owner is None or m.owner == owner]

    def execute(self, model_id: int, inputs, outputs, dynamic=None) -> list[list[int]]:
        """Run over device buffers ``[(ptr, size), ...]``; returns the concrete output dims."""
        loaded = self._get(model_id)
        model = loaded.model
        batch, dims = dynamic_from_wire(dynamic)
        if len(inputs) != len(model.inputs):
            raise AclError(AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                           f"model {model.name!r}: got {len(inputs)} input buffers, expected {len(model.inputs)}")
        if len(outputs) != len(model.outputs):
            raise AclError(AclErrorCode.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH,
                           f"model {model.name!r}: got {len(outputs)} output buffers, expected {len(model.outputs)}")
        in_shapes = resolve_input_shapes(model, batch, dims)
        arrays = []
        for i, ((ptr, size), info, shape) in enumerate(zip(inputs, model.inputs, in_shapes)):
            need = math.prod(shape) * info.dtype.itemsize
            if size < need:
                raise AclError(AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                               f"model {model.name!r} input {i} ({info.name!r}): buffer of {size} bytes, "
                               f"{info.dtype}{list(shape)} needs {need}")
            arrays.append(self.memory.typed_view(ptr, shape, info.dtype, what=f"model {model.name!r} input {i}"))
        out_views = []
        for i, (ptr, size) in enumerate(outputs):
            # a 0-byte buffer may be a null pointer; the executor reports it as too small if it is
            view = self.memory.view(ptr, size, what=f"model {model.name!r} output {i}") if size else np.empty(0, np.uint8)
            out_views.append(view)
        results = loaded.executor.run(arrays, out_views)
        return [list(r.shape) for r in results]
