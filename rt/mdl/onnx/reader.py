"""Reading an ONNX file into plain Python: the only module that imports ``onnx`` (lazily, on first use).

The converter works on :class:`Graph` (inputs, initializers as numpy arrays, nodes with their attributes as
Python values), so nothing past this file depends on the onnx package's protobuf classes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .errors import AtcError, load_failed

INSTALL_HINT = 'atc needs the onnx package to read ONNX models: pip install "npusim[atc]"'

# TensorProto.DataType -> numpy (8 = STRING has no tensor dtype on a card)
ONNX_DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
               9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64, 14: np.complex64,
               15: np.complex128}


def onnx_module():
    """Import onnx now, or fail with the install hint."""
    try:
        import onnx
    except ImportError:
        raise AtcError("E10041", f"Failed to load the model: {INSTALL_HINT}") from None
    return onnx


def onnx_dtype(code: int, where: str) -> np.dtype:
    if code == 16:
        from ...dtypes import BFLOAT16
        return BFLOAT16
    if code not in ONNX_DTYPES:
        raise AtcError("E10001", f"Value [{code}] for parameter [elem_type of {where}] is invalid. Reason: ONNX "
                                 f"data type {code} has no npusim dtype.")
    return np.dtype(ONNX_DTYPES[code])


@dataclasses.dataclass
class OnnxNode:
    op: str
    name: str
    domain: str
    inputs: list[str]       # "" marks an omitted optional input
    outputs: list[str]
    attrs: dict


@dataclasses.dataclass
class Graph:
    name: str
    opset: int
    inputs: list[tuple[str, np.dtype, list | None]]   # dims: int, or None where the file has a symbolic/unknown
    # dim; the whole list is None when the file gives no shape at all
    outputs: list[str]
    initializers: dict[str, np.ndarray]
    nodes: list[OnnxNode]


def _attr_value(onnx, attr):
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, onnx.TensorProto):
        return tensor_array(onnx, value)
    if isinstance(value, (list, tuple)):
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
    if isinstance(value, onnx.GraphProto):
        return value  # a subgraph (If/Loop/Scan): those ops are refused by name, the body is never read
    return value


def tensor_array(onnx, tensor) -> np.ndarray:
    onnx_dtype(tensor.data_type, f"tensor {tensor.name!r}")
    return np.array(onnx.numpy_helper.to_array(tensor))


def load(path: str) -> Graph:
    """Parse the file at ``path`` (external data beside it is loaded too)."""
    onnx = onnx_module()
    try:
        proto = onnx.load(path)
    except Exception as exc:
        raise load_failed(path, f"{type(exc).__name__}: {exc}") from None
    graph = proto.graph
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    initializers = {t.name: tensor_array(onnx, t) for t in graph.initializer}
    inputs = []
    for v in graph.input:
        if v.name in initializers:
            continue  # old exporters list every initializer as an input too
        tt = v.type.tensor_type
        dims = None if not tt.HasField("shape") else [
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim]
        inputs.append((v.name, onnx_dtype(tt.elem_type, f"input {v.name!r}"), dims))
    nodes = [OnnxNode(op=n.op_type, name=n.name, domain=n.domain or "ai.onnx", inputs=list(n.input),
                      outputs=list(n.output), attrs={a.name: _attr_value(onnx, a) for a in n.attribute})
             for n in graph.node]
    return Graph(graph.name or "model", opset, inputs, [o.name for o in graph.output], initializers, nodes)
