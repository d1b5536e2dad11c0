"""The offline-model file format ("npusim-om", the ``.om`` analogue): schema, writer, safe parser.

A model file is one msgpack map (see ``docs/model_format.md``). :func:`parse` treats the bytes as
hostile data: msgpack is decoded with every container and string bounded by the input length and
absolute caps, no extension types, no pickle/eval/import; every field's type is checked; the graph
is checked (known ops, no dangling or doubly produced values, no cycles) and shape inference is
re-run over it so the declared outputs must agree with what the ops compute; the work and memory a
file can cause are bounded by the caps in ``limits.py`` (items, nodes, declared bytes). Anything wrong fails
with ``AclError`` 100003 (not a model file), 100012 (undecodable bytes) or 100013 (malformed
model), with a message naming the offending field or node.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import math

import msgpack
import numpy as np

from ..constants import AclErrorCode
from ..dtypes import NP_TO_ACL
from ..errors import AclError
from ..files import FileRefused, read_regular_file
from ..kernels import registry
from . import limits
from .model import ModelDef, Node, ValueInfo, Weight

FORMAT_TAG = "npusim-om"
FORMAT_VERSION = 1

# Absolute caps: far above any sane model, far below anything that could exhaust the host.
MAX_MODEL_BYTES = 4 << 30  # a model file (weights included)
MAX_STR_LEN = 1 << 16  # names, op types, string attrs
MAX_ARRAY_LEN = 1 << 20  # any one array (nodes, weights, attribute lists; see limits.py for the graph caps)
MAX_MAP_LEN = 1 << 12  # attrs of one node, top-level keys
MAX_RANK = 32  # dims per tensor
MAX_DIM = (1 << 31) - 1  # one dimension
MAX_ATTR_DEPTH = 3  # lists of lists of lists of scalars
MAX_BATCH_GEARS = 100  # CANN allows at most 100 dynamic-batch gears

# The only dtype spellings a file may use: the numpy names of the ACL dtypes.
DTYPES: dict[str, np.dtype] = {str(dt): dt for dt in NP_TO_ACL}

PARSE = AclErrorCode.ACL_ERROR_PARSE_MODEL
ATC_MAGIC = b"IMOD"       # an ATC .om's ModelFileHeader starts with magic 0x444F4D49, little-endian


# ---------------------------------------------------------------------------------------------
# writing


def _info_doc(v: ValueInfo) -> dict:
    return {"name": v.name, "dtype": str(v.dtype), "shape": list(v.shape)}


def to_document(model: ModelDef) -> dict:
    """The msgpack-able map of a model, exactly as it goes into the file."""
    doc = {
        "format": FORMAT_TAG,
        "version": FORMAT_VERSION,
        "name": model.name,
        "inputs": [_info_doc(v) for v in model.inputs],
        "outputs": [_info_doc(v) for v in model.outputs],
        "nodes": [{"op": n.op, "name": n.name, "inputs": list(n.inputs), "outputs": list(n.outputs),
                   "attrs": dict(n.attrs)} for n in model.nodes],
        "weights": [{"name": w.name, "dtype": str(w.dtype), "shape": list(w.shape), "data": bytes(w.data)}
                    for w in model.weights],
    }
    if model.batch_sizes:
        doc["dynamic"] = {"batch_sizes": list(model.batch_sizes)}
    elif model.image_sizes or model.dims:  # gears of the -1 dims (atc --dynamic_image_size / --dynamic_dims)
        key = "image_sizes" if model.image_sizes else "dims"
        doc["dynamic"] = {key: [list(p) for p in model.image_sizes or model.dims]}
    return doc


def serialize(model: ModelDef) -> bytes:
    """Encode a model as npusim-om bytes."""
    if not isinstance(model, ModelDef):
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM, f"serialize: {type(model).__name__} is not a ModelDef "
                                                             f"(build one with rt.mdl.GraphBuilder)")
    return msgpack.packb(to_document(model), use_bin_type=True)


# ---------------------------------------------------------------------------------------------
# reading


_READ_CODES = {"type": AclErrorCode.ACL_ERROR_INVALID_PARAM, "missing": AclErrorCode.ACL_ERROR_READ_MODEL_FAILURE,
               "io": AclErrorCode.ACL_ERROR_READ_MODEL_FAILURE, "not_regular": AclErrorCode.ACL_ERROR_INVALID_FILE,
               "too_large": AclErrorCode.ACL_ERROR_INVALID_FILE_SIZE}


def read_model_file(path) -> bytes:
    """Read a model file: a regular file of at most MAX_MODEL_BYTES (FIFOs, devices, directories and larger
    files are refused before anything is read)."""
    try:
        return read_regular_file(path, MAX_MODEL_BYTES, "load_from_file")
    except FileRefused as e:
        raise AclError(_READ_CODES[e.reason], e.message) from None


def _no_ext(code, data):
    raise ValueError(f"msgpack extension type {code} is not allowed in a model file")


def decode(data) -> dict:
    """Bounded msgpack decode of the top-level map; raises 100003 / 100012."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_FILE,
                       f"load model: expected the model as bytes, got {type(data).__name__}")
    n = len(data)
    if bytes(data[:4]) == ATC_MAGIC:
        raise AclError(PARSE, "load model: this is an ATC-compiled .om (Huawei's ATC built its kernels for a real "
                              "Ascend AI Core), which npusim cannot run. Convert the model's ONNX file with npusim's "
                              "atc, same flags: atc --model=model.onnx --framework=5 --output=model "
                              "--soc_version=Ascend910B1 (docs/atc.md); or build a stand-in with rt.mdl.GraphBuilder "
                              "(docs/pyacl.md, 'A stand-in for an ATC model')")
    if n == 0 or n > MAX_MODEL_BYTES:
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_FILE,
                       f"load model: model size {n} bytes is outside 1..{MAX_MODEL_BYTES}")
    budget = limits.ItemBudget()
    try:
        doc = msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True, ext_hook=_no_ext, timestamp=0,
            list_hook=budget.list_hook, object_hook=budget.object_hook,
            # no container can hold more items than there are bytes, and none is absurdly long
            max_bin_len=n, max_str_len=min(n, MAX_STR_LEN), max_array_len=min(n, MAX_ARRAY_LEN),
            max_map_len=min(n, MAX_MAP_LEN), max_ext_len=0)
    except limits.TooManyItems as exc:
        raise AclError(PARSE, f"load model: {exc}, more than any model needs "
                              f"(at most {limits.MAX_NODES} nodes)") from None
    except Exception as exc:  # msgpack raises ValueError, its own exceptions, RecursionError...
        raise AclError(AclErrorCode.ACL_ERROR_DESERIALIZE_MODEL,
                       f"load model: bytes are not a valid npusim-om (msgpack) document: {type(exc).__name__}: {exc}") from None
    if not isinstance(doc, dict):
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_FILE,
                       f"load model: top level is a {type(doc).__name__}, expected the npusim-om map")
    if doc.get("format") != FORMAT_TAG:
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_FILE,
                       f"load model: format tag is {_short(doc.get('format'))}, expected {FORMAT_TAG!r}")
    return doc


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fail(where: str, message: str):
    raise AclError(PARSE, f"parse model: {where}: {message}")


def _get(doc: dict, key: str, kind, where: str, optional: bool = False):
    if key not in doc:
        if optional:
            return None
        _fail(where, f"missing field {key!r}")
    value = doc[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        expected = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        _fail(where, f"field {key!r} is {type(value).__name__} {_short(value)}, expected {expected}")
    return value


def _name(doc: dict, key: str, where: str) -> str:
    value = _get(doc, key, str, where)
    if not value:
        _fail(where, f"field {key!r} is empty")
    return value


def _dtype(doc: dict, where: str) -> np.dtype:
    text = _get(doc, "dtype", str, where)
    if text not in DTYPES:
        _fail(where, f"dtype {_short(text)} is not one of {sorted(DTYPES)}")
    return DTYPES[text]


def _shape(doc: dict, where: str, dynamic_ok: bool) -> tuple[int, ...]:
    dims = _get(doc, "shape", list, where)
    if len(dims) > MAX_RANK:
        _fail(where, f"shape has {len(dims)} dims, at most {MAX_RANK} allowed")
    low = -1 if dynamic_ok else 0
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool) or not low <= d <= MAX_DIM:
            _fail(where, f"shape {_short(dims)} has dim {_short(d)}, expected an int in {low}..{MAX_DIM}")
    return tuple(dims)


def _attr_value(value, where: str, depth: int = 0):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list) and depth < MAX_ATTR_DEPTH:
        return [_attr_value(v, where, depth + 1) for v in value]
    _fail(where, f"attribute value {_short(value)} ({type(value).__name__}) is not a scalar "
                 f"or a list of at most {MAX_ATTR_DEPTH} levels")


def _names(doc: dict, key: str, where: str) -> tuple[str, ...]:
    items = _get(doc, key, list, where)
    for item in items:
        if not isinstance(item, str) or not item:
            _fail(where, f"{key} entry {_short(item)} is not a value name")
    return tuple(items)


def _value_info(doc, where: str) -> ValueInfo:
    if not isinstance(doc, dict):
        _fail(where, f"expected a map, got {type(doc).__name__}")
    return ValueInfo(_name(doc, "name", where), _dtype(doc, where), _shape(doc, where, dynamic_ok=True))


def _node(doc, where: str) -> Node:
    if not isinstance(doc, dict):
        _fail(where, f"expected a map, got {type(doc).__name__}")
    name = _name(doc, "name", where)
    where = f"node {name!r}"
    attrs = _get(doc, "attrs", dict, where, optional=True) or {}
    attrs = {k: _attr_value(v, f"{where} attr {k!r}") for k, v in attrs.items()}
    return Node(_name(doc, "op", where), name, _names(doc, "inputs", where), _names(doc, "outputs", where), attrs)


def _weight(doc, where: str) -> Weight:
    if not isinstance(doc, dict):
        _fail(where, f"expected a map, got {type(doc).__name__}")
    name = _name(doc, "name", where)
    where = f"weight {name!r}"
    dtype, shape = _dtype(doc, where), _shape(doc, where, dynamic_ok=False)
    data = _get(doc, "data", bytes, where)
    claimed = math.prod(shape) * dtype.itemsize  # exact Python int: no overflow, nothing allocated
    if claimed != len(data):
        _fail(where, f"{dtype}{list(shape)} needs {claimed} bytes but the file holds {len(data)}")
    return Weight(name, dtype, shape, data)


def _dynamic(doc: dict, inputs: tuple[ValueInfo, ...]) -> dict:
    """ModelDef's gear fields from the optional ``dynamic`` map: exactly one of batch_sizes, image_sizes, dims."""
    dynamic = _get(doc, "dynamic", dict, "model", optional=True)
    if not dynamic:
        return {}
    if len(dynamic) != 1 or set(dynamic) - {"batch_sizes", "image_sizes", "dims"}:
        _fail("dynamic", f"keys {sorted(dynamic)}: expected exactly one of batch_sizes, image_sizes, dims")
    if "batch_sizes" in dynamic:
        return {"batch_sizes": _batch_sizes(dynamic, inputs)}
    key = next(iter(dynamic))
    profiles = _get(dynamic, key, list, "dynamic")
    free = sum(v.shape.count(-1) for v in inputs)
    width = 2 if key == "image_sizes" else free
    if not 1 <= len(profiles) <= MAX_BATCH_GEARS or not free or (key == "image_sizes" and any(
            v.shape.count(-1) not in (0, 2) for v in inputs)):
        _fail("dynamic", f"{key}: {len(profiles)} profiles over inputs with {free} dims of -1, expected "
                         f"1..{MAX_BATCH_GEARS} profiles and -1 dims to choose ({'two per input' if width == 2 else 'any'})")
    for p in profiles:
        if not isinstance(p, list) or len(p) != width or not all(
                isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= MAX_DIM for d in p):
            _fail("dynamic", f"{key} profile {_short(p)} is not a list of {width} ints in 1..{MAX_DIM}")
    if len({tuple(p) for p in profiles}) != len(profiles):
        _fail("dynamic", f"{key} has duplicate profiles")
    return {key: tuple(tuple(p) for p in profiles)}


def _batch_sizes(dynamic: dict, inputs: tuple[ValueInfo, ...]) -> tuple[int, ...]:
    sizes = _get(dynamic, "batch_sizes", list, "dynamic")
    if not 1 <= len(sizes) <= MAX_BATCH_GEARS:
        _fail("dynamic", f"batch_sizes has {len(sizes)} entries, expected 1..{MAX_BATCH_GEARS}")
    for b in sizes:
        if not isinstance(b, int) or isinstance(b, bool) or not 1 <= b <= MAX_DIM:
            _fail("dynamic", f"batch size {_short(b)} is not an int in 1..{MAX_DIM}")
    if len(set(sizes)) != len(sizes):
        _fail("dynamic", f"batch_sizes {sizes} has duplicates")
    check_batch_inputs(inputs, "dynamic", _fail)
    return tuple(sizes)


def check_batch_inputs(inputs, where: str, fail) -> None:
    """A dynamic-batch model has -1 only as dim 0 of its inputs, and at least one such input."""
    if not any(v.shape and v.shape[0] == -1 for v in inputs):
        fail(where, "dynamic batch needs an input whose dim 0 is -1")
    for v in inputs:
        if -1 in v.shape[1:]:
            fail(where, f"input {v.name!r} shape {list(v.shape)} has -1 outside dim 0, not allowed with dynamic batch")


def parse(data) -> ModelDef:
    """Decode and fully validate npusim-om bytes; the result is safe to load and execute."""
    # A model is tens of thousands of small objects and none of them cyclic garbage: the cyclic
    # collector's passes over the growing heap would triple the parse time of a large graph.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _parse(data)
    finally:
        if was_enabled:
            gc.enable()


def _parse(data) -> ModelDef:
    doc = decode(data)
    limits.check_counts(doc, _fail)
    version = doc.get("version")
    if version != FORMAT_VERSION:
        _fail("model", f"version is {_short(version)}, this runtime reads version {FORMAT_VERSION}")
    name = _get(doc, "name", str, "model")
    inputs = tuple(_value_info(d, f"inputs[{i}]") for i, d in enumerate(_get(doc, "inputs", list, "model")))
    outputs = tuple(_value_info(d, f"outputs[{i}]") for i, d in enumerate(_get(doc, "outputs", list, "model")))
    nodes = tuple(_node(d, f"nodes[{i}]") for i, d in enumerate(_get(doc, "nodes", list, "model")))
    weights = tuple(_weight(d, f"weights[{i}]") for i, d in enumerate(_get(doc, "weights", list, "model")))
    if not outputs:
        _fail("model", "has no outputs")
    model = ModelDef(name, inputs, outputs, nodes, weights, **_dynamic(doc, inputs))
    return check_graph(model)


def check_graph(model: ModelDef) -> ModelDef:
    """Validate the graph and shapes; return the model with its nodes in topological order."""
    producer: dict[str, str] = {}  # value name -> what produced it (for messages)
    specs: dict[str, registry.TensorSpec] = {}
    for v in model.inputs:
        _produce(producer, v.name, f"input {v.name!r}")
        limits.check_tensor("input", v.name, v.shape, v.dtype, limits.MAX_TENSOR_BYTES, _fail)
        specs[v.name] = v.spec
    for v in model.outputs:  # checked before inference runs: the declared dims alone may be absurd
        limits.check_tensor("output", v.name, v.shape, v.dtype, limits.MAX_TENSOR_BYTES, _fail)
    for w in model.weights:
        _produce(producer, w.name, f"weight {w.name!r}")
        specs[w.name] = w.spec
    node_names = set()
    for node in model.nodes:
        if node.name in node_names:
            _fail(f"node {node.name!r}", "node name used twice")
        node_names.add(node.name)
        for out in node.outputs:
            _produce(producer, out, f"node {node.name!r}")
    for node in model.nodes:
        for value in node.inputs:
            if value not in producer:
                _fail(f"node {node.name!r}", f"input {value!r} is never produced "
                                             f"(no model input, weight or node output has that name)")
    for v in model.outputs:
        if v.name not in producer:
            _fail(f"output {v.name!r}", "is never produced")

    ordered = topological_order(model.nodes, specs.keys())
    for node in ordered:
        where = f"node {node.name!r} ({node.op})"
        try:  # an unknown op fails inside infer, with the op-not-found message
            got = registry.infer(node.op, [specs[v] for v in node.inputs], node.attrs)
        except AclError as exc:
            _fail(where, exc.message)
        except Exception as exc:  # attrs come from the file: an op may choke on their types
            _fail(where, f"shape inference failed: {type(exc).__name__}: {exc}")
        if len(got) != len(node.outputs):
            _fail(where, f"declares {len(node.outputs)} outputs, the op produces {len(got)}")
        for out, spec in zip(node.outputs, got):  # e.g. an Expand or Reshape to absurd dims
            limits.check_tensor(f"node {node.name!r} output", out, spec.shape, spec.dtype, limits.MAX_TENSOR_BYTES,
                                _fail)
        specs.update(zip(node.outputs, got))
    for v in model.outputs:
        have = specs[v.name]
        if have.dtype != v.dtype or have.shape != v.shape:
            _fail(f"output {v.name!r}", f"declared {v.dtype}{list(v.shape)} but the graph computes "
                                        f"{have.dtype}{list(have.shape)} ({producer[v.name]})")
    return dataclasses.replace(model, nodes=tuple(ordered), specs=specs)


def _produce(producer: dict, value: str, by: str) -> None:
    if value in producer:
        _fail(by, f"value {value!r} is already produced by {producer[value]}")
    producer[value] = by


def topological_order(nodes, available) -> list[Node]:
    """Kahn's algorithm; a node left over sits on a cycle."""
    ready_values = set(available)
    waiting = {node.name: {v for v in node.inputs if v not in ready_values} for node in nodes}
    consumers: dict[str, list[Node]] = {}
    for node in nodes:
        for v in waiting[node.name]:
            consumers.setdefault(v, []).append(node)
    queue = collections.deque(node for node in nodes if not waiting[node.name])
    order = []
    while queue:
        node = queue.popleft()
        order.append(node)
        for out in node.outputs:
            for consumer in consumers.pop(out, ()):
                pending = waiting[consumer.name]
                pending.discard(out)
                if not pending:
                    queue.append(consumer)
    if len(order) != len(nodes):
        stuck = sorted(name for name, pending in waiting.items() if pending)
        _fail(f"node {stuck[0]!r}", f"graph has a cycle through nodes {stuck[:8]}")
    return order
