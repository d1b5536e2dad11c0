"""Shapes of a model's values for one execution: dynamic batch / dims resolved, every node's inference re-run.

Both sides use it: the host to check an execution and know the output dims without a round trip, the
card's executor to size intermediates.
"""

from __future__ import annotations

import numpy as np

from ..constants import AclErrorCode
from ..errors import AclError
from ..kernels import registry
from .format import ModelDef

INPUT_MISMATCH = AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH


def dynamic_from_wire(dynamic) -> tuple[int | None, dict[int, tuple[int, ...]]]:
    """Decode the execute-time choice: None, ``{"batch": n}`` and/or ``{"dims": {index: dims}}``.

    ``dims`` keys may be ints or decimal strings (msgpack with ``strict_map_key`` only carries
    string keys), or the map may be a list of ``[index, dims]`` pairs.
    """
    if dynamic is None:
        return None, {}
    if not isinstance(dynamic, dict) or set(dynamic) - {"batch", "dims"}:
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM,
                       f"model execute: dynamic={dynamic!r}, expected None, {{'batch': n}} or {{'dims': {{index: dims}}}}")
    batch = dynamic.get("batch")
    if batch is not None and (not isinstance(batch, (int, np.integer)) or isinstance(batch, bool) or batch < 1):
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM, f"model execute: dynamic batch {batch!r} is not a positive int")
    pairs = dynamic.get("dims") or {}
    pairs = pairs.items() if isinstance(pairs, dict) else pairs
    dims = {}
    try:
        for index, shape in pairs:
            dims[int(index)] = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM,
                       f"model execute: dynamic dims {dynamic.get('dims')!r} must map input indices to lists of ints") from None
    return (None if batch is None else int(batch)), dims


def resolve_input_shapes(model: ModelDef, batch: int | None = None, dims=None) -> list[tuple[int, ...]]:
    """Concrete input shapes for one execution from the chosen batch gear / explicit dims."""
    dims = dims or {}
    for index in dims:
        if not 0 <= index < len(model.inputs):
            raise AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM,
                           f"model {model.name!r}: dynamic dims given for input index {index}, "
                           f"the model has {len(model.inputs)} inputs")
    if batch is not None:
        if not model.batch_sizes:
            raise AclError(AclErrorCode.ACL_ERROR_MODEL_NOT_DYNAMIC,
                           f"model {model.name!r}: batch size {batch} set but the model has no dynamic batch")
        if batch not in model.batch_sizes:
            raise AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM,
                           f"model {model.name!r}: batch size {batch} is not one of the model's gears {list(model.batch_sizes)}")
    shapes = []
    for i, v in enumerate(model.inputs):
        if i in dims:
            shape = dims[i]
            if len(shape) != len(v.shape) or any(d < 0 or (want != -1 and d != want) for d, want in zip(shape, v.shape)):
                raise AclError(INPUT_MISMATCH, f"model {model.name!r} input {i} ({v.name!r}): dims {list(shape)} do not fit "
                                               f"the declared shape {list(v.shape)}")
        elif -1 not in v.shape:
            shape = v.shape
        elif batch is not None and -1 not in v.shape[1:]:
            shape = (batch,) + v.shape[1:]
        else:
            need = "a batch size (set_dynamic_batch_size)" if model.batch_sizes else "its dims (set_input_dynamic_dims)"
            raise AclError(INPUT_MISMATCH, f"model {model.name!r} input {i} ({v.name!r}) has dynamic shape "
                                           f"{list(v.shape)}; the execution must choose {need}")
        shapes.append(tuple(shape))
    check_gear(model, shapes)
    return shapes


def gear_shapes(model: ModelDef, profile) -> list[tuple[int, ...]]:
    """Input shapes at one ``image_sizes`` / ``dims`` gear: the -1 dims take the gear's values in input order
    (an image size applies to the two -1 dims of every input that has them)."""
    shapes = []
    values = iter(profile)
    for v in model.inputs:
        if model.image_sizes:
            values = iter(profile)
        shapes.append(tuple(next(values) if d == -1 else d for d in v.shape))
    return shapes


def gear_list(model: ModelDef) -> str:
    """The model's image-size / dims gears as a message shows them."""
    key = "image size" if model.image_sizes else "dims"
    return f"{key} gears {[list(p) for p in model.image_sizes or model.dims]}"


def check_gear(model: ModelDef, shapes, index: int | None = None, call: str = "model execute") -> None:
    """Refuse input shapes (all of them, or only input ``index``'s) that are not at one of the model's
    ``image_sizes`` / ``dims`` gears, as CANN refuses a size it was not compiled for (100000)."""
    profiles = model.image_sizes or model.dims
    if not profiles:
        return
    at = [gear_shapes(model, p) for p in profiles]
    if index is None:
        fits = [tuple(s) for s in shapes] in at
    else:
        fits = tuple(shapes) in {g[index] for g in at}
    if not fits:
        what = "input shapes" if index is None else f"input {index} ({model.inputs[index].name!r}) dims"
        got = [list(s) for s in shapes] if index is None else list(shapes)
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM,
                       f"{call}: model {model.name!r}: {what} {got} are not at one of the model's {gear_list(model)}")


def max_input_shapes(model: ModelDef) -> list[tuple[int, ...]] | None:
    """Input shapes at the largest batch gear (what the host must allocate), or None if unbounded."""
    if model.batch_sizes:
        return resolve_input_shapes(model, batch=max(model.batch_sizes))
    if any(-1 in v.shape for v in model.inputs):
        return None
    return [v.shape for v in model.inputs]


def infer_shapes(model: ModelDef, input_shapes) -> dict[str, registry.TensorSpec]:
    """Concrete specs of every value for these input shapes (re-runs each op's inference)."""
    specs = {v.name: registry.TensorSpec(s, v.dtype) for v, s in zip(model.inputs, input_shapes)}
    specs.update((w.name, w.spec) for w in model.weights)
    for node in model.nodes:
        try:
            got = registry.infer(node.op, [specs[v] for v in node.inputs], node.attrs)
        except AclError as exc:
            shapes = {v.name: list(s) for v, s in zip(model.inputs, input_shapes)}
            raise AclError(INPUT_MISMATCH, f"model {model.name!r}: inputs {shapes} do not fit node "
                                           f"{node.name!r} ({node.op}): {exc.message}") from None
        specs.update(zip(node.outputs, got))
    return specs


def output_specs(model: ModelDef, input_shapes) -> list[registry.TensorSpec]:
    specs = infer_shapes(model, input_shapes)
    return [specs[v.name] for v in model.outputs]
