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
from ..mdl import format as fmt
from ..mdl import limits
from ..mdl.shapes import dynamic_from_wire, gear_shapes, infer_shapes, max_input_shapes, resolve_input_shapes
from .executor import Executor


def _io_desc(info: fmt.ValueInfo, size: int) -> dict:
    return {"name": info.name, "dtype": str(info.dtype), "acl_dtype": int(acl_dtype(info.dtype)),
            "dims": list(info.shape), "size": size}


def _largest_shapes(model: fmt.ModelDef) -> list:
    """The input shapes a host must be able to allocate for: each image-size / dims gear, else the largest
    batch gear or the static shapes; ``[None]`` when a -1 dim has no gear to bound it."""
    profiles = model.image_sizes or model.dims
    if profiles:
        return [gear_shapes(model, p) for p in profiles]
    return [max_input_shapes(model)]


def describe(model: fmt.ModelDef, capacity: int | None = None) -> dict:
    """The msgpack-able description the host's ``get_desc`` serves.

    ``dims`` are the declared dims (-1 for dynamic ones), an output's ``max_dims`` its dims at the largest gear
    (what CANN's aclmdlGetOutputDims reports); ``size`` is what the host must allocate, as CANN's desc reports
    it: the size at the largest gear (batch, image size or dims) for a model with gears, 0 when a -1 dim has no
    gear to bound it (an output whose shape does not depend on such a dim has its size). With ``capacity`` (the card's HBM bytes), a model
    whose inputs, outputs or intermediates at any gear cannot fit the card is refused here, before any
    size reaches the wire.
    """
    declared = [v.shape for v in model.inputs]
    sizes = {v.name: 0 for v in (*model.inputs, *model.outputs)}
    largest, largest_elems = {}, -1     # output dims at the largest gear (the most input elements)
    for in_shapes in _largest_shapes(model):
        try:  # unbounded dims: the symbolic shapes (-1 counts as 1 in the capacity check)
            if model.specs is not None and in_shapes in (None, declared):
                specs = model.specs  # what parse inferred at exactly these shapes
            else:
                specs = infer_shapes(model, in_shapes if in_shapes is not None else declared)
        except AclError as exc:  # e.g. a fixed Reshape that only fits some of the gears
            raise AclError(AclErrorCode.ACL_ERROR_PARSE_MODEL,
                           f"parse model: model {model.name!r} cannot run at its input shapes "
                           f"{[list(s) for s in in_shapes or ()]}: {exc.message}") from None
        if capacity is not None:
            limits.check_fits_card(model, specs, capacity, fmt._fail)
        if in_shapes is not None:
            for v in (*model.inputs, *model.outputs):
                sizes[v.name] = max(sizes[v.name], math.prod(specs[v.name].shape) * v.dtype.itemsize)
            elems = sum(math.prod(shape) for shape in in_shapes)
            if elems > largest_elems:
                largest_elems = elems
                largest = {v.name: list(specs[v.name].shape) for v in model.outputs}
        else:                           # unbounded inputs: an output whose shape does not depend on them has a size
            for v in model.outputs:
                shape = specs[v.name].shape
                if all(d >= 0 for d in shape):
                    sizes[v.name] = math.prod(shape) * v.dtype.itemsize
    outputs = [_io_desc(v, sizes[v.name]) for v in model.outputs]
    for item in outputs:                # CANN's aclmdlGetOutputDims: the largest gear's dims
        item["max_dims"] = largest.get(item["name"], item["dims"])
    return {
        "name": model.name,
        "inputs": [_io_desc(v, sizes[v.name]) for v in model.inputs],
        "outputs": outputs,
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
