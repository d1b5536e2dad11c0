"""GraphBuilder: write offline models in Python, with shape and dtype inference at build time.

    g = GraphBuilder("mlp")
    x = g.input("x", "float32", [-1, 64])
    w = g.constant("w1", np.random.rand(64, 128).astype(np.float32))
    h = g.op("Relu", [g.op("MatMul", [x, w])])
    g.output("y", h)
    g.set_dynamic_batch([1, 2, 4, 8])
    g.save("mlp.om")

Every ``g.op`` runs the op's shape inference at once, so a wrong shape, dtype or attribute fails
right there with the op's ``AclError``, not when the model is loaded.
"""

from __future__ import annotations

import numpy as np

from .. import args
from ..constants import AclErrorCode
from ..dtypes import np_dtype
from ..errors import AclError
from ..files import FileRefused, check_path
from ..kernels import registry
from . import format as fmt
from . import limits
from .shapes import infer_shapes, resolve_input_shapes

INVALID = AclErrorCode.ACL_ERROR_INVALID_PARAM


class Value:
    """A handle to a tensor of the graph under construction (``.name``, ``.shape``, ``.dtype``)."""

    def __init__(self, graph: GraphBuilder, name: str, spec: registry.TensorSpec, kind: str):
        self.graph = graph
        self.name = name
        self.spec = spec
        self.kind = kind  # "input", "constant", "node" (auto-named), "named" (user-named node output)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.spec.shape

    @property
    def dtype(self) -> np.dtype:
        return self.spec.dtype

    def __repr__(self) -> str:
        return f"Value({self.name!r}, {self.dtype}{list(self.shape)})"


class _PendingNode:
    def __init__(self, op: str, name: str, inputs: list[Value], outputs: list[Value], attrs: dict):
        self.op, self.name, self.inputs, self.outputs, self.attrs = op, name, inputs, outputs, attrs


def _attr(key: str, value, depth: int = 0):
    """Normalise an attribute to the msgpack-able types the file format allows."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, int) and not isinstance(value, bool) and not -(1 << 63) <= value < 1 << 63:
        raise AclError(INVALID, f"GraphBuilder.op: attribute {key}={args.shown(value)} does not fit int64")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and depth < fmt.MAX_ATTR_DEPTH:
        return [_attr(key, v, depth + 1) for v in value]
    raise AclError(INVALID, f"GraphBuilder.op: attribute {key}={value!r} is not a number, string, bool "
                            f"or a (nested, at most {fmt.MAX_ATTR_DEPTH} levels) list of them")


def _refuse(call: str):
    """A ``fail(where, message)`` for the shared limit checks that raises the builder's code."""
    def fail(where: str, message: str):
        raise AclError(INVALID, f"{call}: {where}: {message}")
    return fail


def _check_name(what: str, name) -> str:
    if not isinstance(name, str) or not name or len(name) > fmt.MAX_STR_LEN:
        raise AclError(INVALID, f"GraphBuilder.{what}: name {name!r} must be a non-empty string "
                                f"of at most {fmt.MAX_STR_LEN} characters")
    return name


class GraphBuilder:
    """Builds a :class:`~rt.mdl.format.ModelDef` node by node (DESIGN §3)."""

    def __init__(self, name: str):
        self.name = _check_name("__init__", name)
        self._inputs: list[Value] = []
        self._weights: list[tuple[Value, bytes]] = []
        self._nodes: list[_PendingNode] = []
        self._outputs: list[tuple[str, Value]] = []
        self._values: dict[str, Value] = {}
        self._node_names: set[str] = set()
        self._batch_sizes: tuple[int, ...] = ()

    # -- values ---------------------------------------------------------------------------------

    def _claim(self, what: str, name: str) -> str:
        _check_name(what, name)
        if name in self._values:
            raise AclError(INVALID, f"GraphBuilder.{what}: value name {name!r} is already used by {self._values[name]!r}")
        return name

    def input(self, name: str, dtype, shape) -> Value:
        """Declare a model input; ``-1`` in ``shape`` is a dynamic dim."""
        self._claim("input", name)
        call = f"GraphBuilder.input({name!r})"
        shape = tuple(args.int_list(shape, call, "shape", lo=-1, hi=fmt.MAX_DIM))
        if len(shape) > fmt.MAX_RANK:
            raise AclError(INVALID, f"{call}: shape {list(shape)} has {len(shape)} dims, at most {fmt.MAX_RANK} allowed")
        dtype = np_dtype(dtype)
        limits.check_tensor("input", name, shape, dtype, limits.MAX_TENSOR_BYTES, _refuse(call))
        value = Value(self, name, registry.TensorSpec(shape, dtype), "input")
        self._values[name] = value
        self._inputs.append(value)
        return value

    def constant(self, name: str, array) -> Value:
        """Add a weight (copied now, so later changes to ``array`` do not leak into the model)."""
        self._claim("constant", name)
        array = np.asarray(array)
        dtype = np_dtype(array.dtype.newbyteorder("="))  # the file stores native little-endian bytes
        array = np.ascontiguousarray(array, dtype=dtype).reshape(array.shape)  # ascontiguousarray makes 0-d 1-d
        value = Value(self, name, registry.TensorSpec(array.shape, dtype), "constant")
        self._values[name] = value
        self._weights.append((value, array.tobytes()))
        return value

    # -- nodes ----------------------------------------------------------------------------------

    def op(self, op_type: str, inputs, *, outputs=None, name: str | None = None, **attrs):
        """Apply an op; returns its output Value, or a tuple of Values for several outputs."""
        call = f"GraphBuilder.op({args.shown(op_type)})"
        opdef = registry.get_op(args.text(op_type, call, "op_type"))
        inputs = args.sequence(inputs, call, "inputs")
        for i, v in enumerate(inputs):
            if not isinstance(v, Value) or v.graph is not self:
                raise AclError(INVALID, f"GraphBuilder.op({op_type}): input {i} is {v!r}, "
                                        f"expected a Value of graph {self.name!r}")
        attrs = {_check_name("op attribute", k): _attr(k, v) for k, v in attrs.items()}
        specs = registry.infer(opdef.name, [v.spec for v in inputs], attrs)

        if name is None:
            name = f"{opdef.name}_{len(self._nodes)}"
            while name in self._node_names:
                name += "_"
        elif _check_name("op", name) in self._node_names:
            raise AclError(INVALID, f"GraphBuilder.op({op_type}): node name {name!r} is already used")
        if outputs is None:
            out_names = [name] if len(specs) == 1 else [f"{name}:{i}" for i in range(len(specs))]
            kind = "node"
        else:
            out_names = [outputs] if isinstance(outputs, str) else args.sequence(outputs, call, "outputs")
            kind = "named"
            if len(out_names) != len(specs):
                raise AclError(INVALID, f"GraphBuilder.op({op_type}): outputs={out_names} names "
                                        f"{len(out_names)} values, the op produces {len(specs)}")
        for out in out_names:
            self._claim(f"op({op_type})", out)
        if len(set(out_names)) != len(out_names):
            raise AclError(INVALID, f"GraphBuilder.op({op_type}): outputs={out_names} repeats a name")

        values = [Value(self, n, s, kind) for n, s in zip(out_names, specs)]
        for v in values:
            self._values[v.name] = v
        self._node_names.add(name)
        self._nodes.append(_PendingNode(opdef.name, name, inputs, values, attrs))
        if len(values) == 1:
            return values[0]
        return tuple(values)

    def output(self, name: str, value: Value) -> None:
        """Mark ``value`` as a model output called ``name``."""
        _check_name("output", name)
        if not isinstance(value, Value) or value.graph is not self:
            raise AclError(INVALID, f"GraphBuilder.output({name!r}): {value!r} is not a Value of graph {self.name!r}")
        if any(n == name for n, _ in self._outputs):
            raise AclError(INVALID, f"GraphBuilder.output: output name {name!r} is already used")
        already_output = any(v is value for _, v in self._outputs)
        if value.name != name:
            if value.kind == "node" and not already_output and name not in self._values:
                # an auto-named node output simply takes the output's name
                del self._values[value.name]
                value.name, value.kind = name, "named"
                self._values[name] = value
            else:
                # inputs, weights and values already exported under another name need a copy
                value = self.op("Identity", [value], outputs=[name])
        self._outputs.append((name, value))

    def set_dynamic_batch(self, batch_sizes) -> None:
        """Make dim 0 (declared -1) of the inputs a dynamic batch chosen per execution from these gears."""
        sizes = tuple(args.int_list(batch_sizes, "GraphBuilder.set_dynamic_batch", "batch_sizes", lo=1, hi=fmt.MAX_DIM))
        if not 1 <= len(sizes) <= fmt.MAX_BATCH_GEARS or len(set(sizes)) != len(sizes):
            raise AclError(INVALID, f"GraphBuilder.set_dynamic_batch: {list(sizes)} must be 1..{fmt.MAX_BATCH_GEARS} "
                                    f"distinct positive batch sizes")
        self._batch_sizes = sizes

    # -- results --------------------------------------------------------------------------------

    def build(self) -> fmt.ModelDef:
        """The finished, validated model."""
        if not self._outputs:
            raise AclError(INVALID, f"GraphBuilder.build: model {self.name!r} has no outputs; call g.output(name, value)")
        # the loader's graph-size caps: a model built here must load
        limits.check_counts({"inputs": self._inputs, "outputs": self._outputs, "nodes": self._nodes,
                             "weights": self._weights}, _refuse("GraphBuilder.build"))
        inputs = tuple(fmt.ValueInfo(v.name, v.dtype, v.shape) for v in self._inputs)
        if self._batch_sizes:
            def fail(where, message):
                raise AclError(INVALID, f"GraphBuilder.set_dynamic_batch: {message}")
            fmt.check_batch_inputs(inputs, "dynamic", fail)
        model = fmt.ModelDef(
            name=self.name,
            inputs=inputs,
            outputs=tuple(fmt.ValueInfo(n, v.dtype, v.shape) for n, v in self._outputs),
            nodes=tuple(fmt.Node(n.op, n.name, tuple(v.name for v in n.inputs), tuple(v.name for v in n.outputs),
                                 dict(n.attrs)) for n in self._nodes),
            weights=tuple(fmt.Weight(v.name, v.dtype, v.shape, data) for v, data in self._weights),
            batch_sizes=self._batch_sizes,
        )
        model = fmt.check_graph(model)
        for batch in self._batch_sizes:  # every gear must run, not just the symbolic -1 graph
            try:
                infer_shapes(model, resolve_input_shapes(model, batch=batch))
            except AclError as exc:
                raise AclError(INVALID, f"GraphBuilder.set_dynamic_batch: batch {batch}: {exc.message}") from None
        return model

    def serialize(self) -> bytes:
        """The model as npusim-om bytes."""
        return fmt.serialize(self.build())

    def save(self, path) -> None:
        """Write the model file (``.om`` by convention)."""
        try:
            text = check_path(path, "GraphBuilder.save")
        except FileRefused as e:
            raise AclError(INVALID, e.message) from None
        data = self.serialize()
        try:
            with open(text, "wb") as f:
                f.write(data)
        except OSError as e:  # a directory, a missing parent, no permission, a full disk
            raise AclError(AclErrorCode.ACL_ERROR_WRITE_FILE,
                           f"GraphBuilder.save: cannot write {text!r}: {e.strerror or e}") from None
