"""Run a parsed model over numpy arrays: resolve dynamic dims, infer concrete shapes, compute nodes.

The executor is pure numpy and knows nothing about cards: the card's ``ModelStore`` hands it views
of card memory; tests hand it plain arrays. Intermediates are fresh numpy arrays per run.
"""

from __future__ import annotations

import math

import numpy as np

from ..constants import AclErrorCode
from ..errors import AclError
from ..kernels import registry
from .format import ModelDef

INPUT_MISMATCH = AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH
OUTPUT_MISMATCH = AclErrorCode.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH


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
    return shapes


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


def _as_output(buffer: np.ndarray, spec: registry.TensorSpec, index: int, model: ModelDef) -> np.ndarray:
    """View a caller's output buffer (any dtype, treated as raw bytes) as the output tensor."""
    need = math.prod(spec.shape) * spec.dtype.itemsize
    if not buffer.flags.c_contiguous or not buffer.flags.writeable:
        raise AclError(OUTPUT_MISMATCH, f"model {model.name!r} output {index}: buffer must be writable and contiguous")
    if buffer.nbytes < need:
        raise AclError(OUTPUT_MISMATCH, f"model {model.name!r} output {index} ({model.outputs[index].name!r}): "
                                        f"buffer holds {buffer.nbytes} bytes, {spec.dtype}{list(spec.shape)} needs {need}")
    return buffer.reshape(-1).view(np.uint8)[:need].view(spec.dtype).reshape(spec.shape)


class Executor:
    """Runs one model; ``weights`` maps weight names to arrays (card-memory views on a card)."""

    def __init__(self, model: ModelDef, weights: dict[str, np.ndarray] | None = None):
        self.model = model
        self.weights = weights if weights is not None else {w.name: w.array() for w in model.weights}
        self.ops = {node.name: registry.get_op(node.op) for node in model.nodes}

    def check_inputs(self, inputs) -> list[tuple[int, ...]]:
        model = self.model
        if len(inputs) != len(model.inputs):
            raise AclError(INPUT_MISMATCH, f"model {model.name!r}: got {len(inputs)} inputs, expected {len(model.inputs)} "
                                           f"({[v.name for v in model.inputs]})")
        for i, (a, v) in enumerate(zip(inputs, model.inputs)):
            ok_shape = len(a.shape) == len(v.shape) and all(w in (-1, d) for d, w in zip(a.shape, v.shape))
            if a.dtype != v.dtype or not ok_shape:
                raise AclError(INPUT_MISMATCH, f"model {model.name!r} input {i} ({v.name!r}): got {a.dtype}{list(a.shape)}, "
                                               f"expected {v.dtype}{list(v.shape)}")
            if model.batch_sizes and v.shape and v.shape[0] == -1 and a.shape[0] not in model.batch_sizes:
                raise AclError(INPUT_MISMATCH, f"model {model.name!r} input {i} ({v.name!r}): batch {a.shape[0]} is not "
                                               f"one of the gears {list(model.batch_sizes)}")
        return [tuple(a.shape) for a in inputs]

    def run(self, inputs, outputs=None) -> list[np.ndarray]:
        """Execute; ``outputs`` are optional byte buffers to fill. Returns the output tensors."""
        model = self.model
        inputs = [np.asarray(a) for a in inputs]
        specs = infer_shapes(model, self.check_inputs(inputs))
        out_specs = [specs[v.name] for v in model.outputs]
        if outputs is None:
            results = [np.empty(s.shape, s.dtype) for s in out_specs]
        else:
            if len(outputs) != len(model.outputs):
                raise AclError(OUTPUT_MISMATCH, f"model {model.name!r}: got {len(outputs)} output buffers, "
                                                f"expected {len(model.outputs)} ({[v.name for v in model.outputs]})")
            results = [_as_output(np.asarray(b), s, i, model) for i, (b, s) in enumerate(zip(outputs, out_specs))]

        # A node writes straight into the output buffer of a value exported exactly once.
        names = [v.name for v in model.outputs]
        direct = {n: results[i] for i, n in enumerate(names) if names.count(n) == 1}
        env: dict[str, np.ndarray] = dict(self.weights)
        env.update((v.name, a) for v, a in zip(model.inputs, inputs))
        for node in model.nodes:
            outs = [direct[n] if n in direct else np.empty(specs[n].shape, specs[n].dtype) for n in node.outputs]
            try:
                self.ops[node.name].compute([env[n] for n in node.inputs], outs, node.attrs)
            except AclError as exc:
                raise AclError(exc.code, f"model {model.name!r} node {node.name!r} ({node.op}): {exc.message}") from None
            except MemoryError:
                raise AclError(AclErrorCode.ACL_ERROR_RT_MEMORY_ALLOCATION,
                               f"model {model.name!r} node {node.name!r} ({node.op}): "
                               f"out of host memory for intermediates") from None
            env.update(zip(node.outputs, outs))
        for name, result in zip(names, results):
            if env[name] is not result:  # outputs that are inputs/weights or exported twice
                result[...] = env[name]
        return results
