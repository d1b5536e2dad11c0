"""Run a parsed model over numpy arrays (on the card, over views of card memory; in tests, plain arrays).

The executor is pure numpy and knows nothing about cards: the card's ``ModelStore`` hands it views of card
memory. Intermediates are fresh numpy arrays per run.
"""

from __future__ import annotations

import math

import numpy as np

from ..constants import AclErrorCode
from ..errors import AclError
from ..kernels import registry
from ..mdl.format import ModelDef
from ..mdl.shapes import infer_shapes
from ..wire.segment import check_host_memory

INPUT_MISMATCH = AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH
OUTPUT_MISMATCH = AclErrorCode.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH
HOST_CHECK_FROM = 64 << 20   # smaller executions fit the headroom check_host_memory keeps free: skip its cost


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

    def __init__(self, model: ModelDef, weights: dict[str, np.ndarray] | None = None, max_bytes: int | None = None):
        self.model = model
        self.max_bytes = max_bytes  # on a card its HBM: no intermediate of one execution may exceed it
        self.weights = weights if weights is not None else {w.name: w.array() for w in model.weights}
        self.ops = {node.name: registry.get_op(node.op) for node in model.nodes}
        self._sized: dict[tuple, int] = {}  # input shapes -> bytes of one execution's intermediates (checked)

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

    def _check_sizes(self, specs) -> None:
        """Dynamic dims chosen per execution can blow an intermediate up past the card (or numpy's
        limits): refuse before allocating anything."""
        if self.max_bytes is None:
            return
        shapes = tuple(specs[v.name].shape for v in self.model.inputs)
        total = self._sized.get(shapes)
        if total is None:                    # the first execution at these input shapes (a static model: the first)
            if len(self._sized) >= 64:       # free dynamic dims: keep the memo bounded
                self._sized.clear()
            total = self._sized[shapes] = self._intermediates(specs)
        if total > HOST_CHECK_FROM:   # intermediates live in host RAM: past a container's limit = SIGKILL
            check_host_memory(total, f"model {self.model.name!r}: the intermediates of one execution")

    def _intermediates(self, specs) -> int:
        """Bytes of every node output at these specs; 207001 naming the first one larger than the card."""
        total = 0
        for node in self.model.nodes:
            for out in node.outputs:
                spec = specs[out]
                need = math.prod(spec.shape) * spec.dtype.itemsize
                total += need
                if need > self.max_bytes:
                    raise AclError(AclErrorCode.ACL_ERROR_RT_MEMORY_ALLOCATION,
                                   f"model {self.model.name!r} node {node.name!r} ({node.op}): output {out!r} "
                                   f"{spec.dtype}{list(spec.shape)} needs {need} bytes, more than the card's "
                                   f"{self.max_bytes}")
        return total

    def run(self, inputs, outputs=None) -> list[np.ndarray]:
        """Execute; ``outputs`` are optional byte buffers to fill. Returns the output tensors."""
        model = self.model
        inputs = [np.asarray(a) for a in inputs]
        specs = infer_shapes(model, self.check_inputs(inputs))
        self._check_sizes(specs)
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
            try:  # intermediates are allocated here: a MemoryError is this node's, too
                outs = [direct[n] if n in direct else np.empty(specs[n].shape, specs[n].dtype) for n in node.outputs]
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
