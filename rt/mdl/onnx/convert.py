"""ONNX graph -> npusim offline model (:class:`~rt.mdl.ModelDef`), as ``atc --framework=5`` does for a card.

One pass over the nodes in file order (ONNX stores them topologically sorted), through a ``GraphBuilder`` so
every emitted node is shape-checked by its kernel as it is added:

1. initializers become weights (only those a card node reads: folded-away shape constants are dropped);
2. a node whose inputs are all known constants is folded with numpy (``fold.py``); ``Shape`` folds from the
   inferred static shape of its input;
3. any other node becomes the card kernel of the same ONNX name, its static parameter inputs turned into
   attributes (``ops.PARAM_INPUTS``), or a lowering onto other kernels (``ops.LOWERINGS``), or is refused with
   ATC's E19010 naming the node and its op type.

``--input_fp16_nodes`` inputs are declared float16 and cast to the graph's float32 on the card; ``--output_type``
adds a Cast in front of the outputs; ``--out_nodes`` picks the outputs; ``--dynamic_batch_size`` makes the
model's dynamic-batch gears, ``--dynamic_image_size`` / ``--dynamic_dims`` leave -1 dims (chosen per execution
with ``set_input_dynamic_dims``) after checking the graph at every profile.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from ...errors import AclError
from ...kernels.registry import REGISTRY, infer
from ..builder import GraphBuilder
from ..format import ModelDef
from ..shapes import infer_shapes
from . import fold as folding
from . import reader
from .errors import AtcError, no_parser, op_param_invalid
from .ops import LOWERINGS, PARAM_INPUTS, attrs_for, param_value
from .options import ConvertOptions

# outputs an exporter may list that a card kernel need not produce (training statistics, pooling indices)
OPTIONAL_OUTPUTS = {"Dropout": 1, "BatchNormalization": 1, "LayerNormalization": 1, "MaxPool": 1}


def _not_found(name: str, parameter: str) -> AtcError:
    return AtcError("E10016", f"Opname [{name}] specified in [--{parameter}] is not found in the model. Confirm "
                              f"whether this node name exists, or the node is not split with the specified "
                              f"delimiter ';'.")


def _unsupported(node: str, op: str, reason: str) -> AtcError:
    return AtcError("E10055", f"The operation is not supported. Reason: Op [{node}] ({op}): {reason}.")


class _Converter:
    def __init__(self, graph: reader.Graph, options: ConvertOptions, name: str):
        self.graph, self.options = graph, options
        self.g = GraphBuilder(name)
        self.consts: dict[str, np.ndarray] = dict(graph.initializers)
        self.tainted: set[str] = set()          # folded values computed from a dynamic (-1) dim
        self.values: dict = {}                  # ONNX value name -> builder Value
        self.weights: dict = {}                 # ONNX constant name -> builder Value (made on first card use)
        self.node_names: set[str] = set()
        self.rename: dict[str, str] = {}        # outputs that get a Cast: their pre-cast value's name
        self.used: set[str] = set()             # every value a node or the model output reads

    # -- inputs -------------------------------------------------------------------------------------------

    def declare_inputs(self) -> None:
        opts = self.options
        names = [n for n, _, _ in self.graph.inputs]
        for name in opts.input_shape:
            if name not in names:
                raise _not_found(name, "input_shape")
        for name in opts.input_fp16_nodes:
            if name not in names:
                raise _not_found(name, "input_fp16_nodes")
        for name, dtype, dims in self.graph.inputs:
            shape = opts.input_shape.get(name)
            if shape is None and dims is None:
                raise AtcError("E11005", f"The shape is not defined by using --input_shape for input [{name}].")
            if shape is None:
                shape = [-1 if d is None else d for d in dims]
            elif dims and len(shape) != len(dims):
                raise AtcError("E10049", f"Dimension count [{len(shape)}] configured in --input_shape does not match "
                                         f"dimension count [{len(dims)}] of the node [{name}].")
            if name in opts.input_fp16_nodes:
                if dtype != np.float32:
                    raise AtcError("E10001", f"Value [{name}] for parameter [--input_fp16_nodes] is invalid. Reason: "
                                             f"the input is {dtype}, only float32 inputs can be fed as fp16.")
                half = self.g.input(name, "float16", shape)
                self.values[name] = self.g.op("Cast", [half], name=f"{name}/fp16_to_fp32", to="float32")
            else:
                self.values[name] = self.g.input(name, dtype, shape)

    # -- nodes --------------------------------------------------------------------------------------------

    def known(self, name: str) -> bool:
        return name in self.values or name in self.consts

    def value(self, name: str, node: str):
        """The builder Value of ``name``, making a weight of a constant on first use."""
        if name in self.values:
            return self.values[name]
        if name not in self.consts:
            raise reader.load_failed(self.graph.name, f"node [{node}] reads [{name}], which no input, initializer "
                                                      f"or earlier node produces (graph not topologically sorted?)")
        if name in self.tainted:
            raise op_param_invalid(name, name, node, "it is computed from a dynamic (-1) input dim; give that "
                                                     "input a static shape with --input_shape")
        if name not in self.weights:
            self.weights[name] = self.g.constant(self.out_name(name), self.consts[name])
        return self.weights[name]

    def unique_name(self, node: reader.OnnxNode, index: int) -> str:
        name = node.name or f"{node.op}_{index}"
        while name in self.node_names:
            name += "_"
        self.node_names.add(name)
        return name

    def fold(self, node: reader.OnnxNode, name: str) -> bool:
        """Fold the node if everything it reads is known now; True if it did."""
        present = [i for i in node.inputs if i]
        if node.op in ("Shape", "Size") and present and self.known(present[0]):
            x = present[0]
            shape = self.values[x].shape if x in self.values else self.consts[x].shape
            out = folding.shape_of(shape, node.attrs) if node.op == "Shape" else np.array(np.prod(shape), np.int64)
            if node.op == "Size" and -1 in shape:
                return False
            self.consts[node.outputs[0]] = out
            if -1 in out:
                self.tainted.add(node.outputs[0])
            return True
        if node.op not in folding.FOLDERS or not all(i in self.consts for i in present):
            return False
        tainted = any(i in self.tainted for i in present)
        if tainted and node.op not in folding.MOVERS:
            raise op_param_invalid(next(i for i in present if i in self.tainted), node.op, name,
                                   "npusim folds shape arithmetic at conversion and this value depends on a dynamic "
                                   "(-1) input dim; give the input a static shape with --input_shape, or use "
                                   "--dynamic_batch_size with a graph that only forwards the batch dim")
        try:
            outs = folding.fold(node.op, [self.consts[i] if i else None for i in node.inputs], node.attrs)
        except Exception as exc:
            raise _unsupported(name, node.op, f"constant folding failed: {type(exc).__name__}: {exc}") from None
        for out, arr in zip(node.outputs, outs):
            self.consts[out] = arr
            if tainted and np.issubdtype(arr.dtype, np.integer) and (arr == -1).any():
                self.tainted.add(out)
        return True

    def emit(self, node: reader.OnnxNode, name: str) -> None:
        if node.domain not in ("ai.onnx", ""):
            raise no_parser(name, node.op, self.graph.opset, node.domain)
        params = PARAM_INPUTS.get(node.op, {})
        attrs = attrs_for(node.op, node.attrs)
        if node.op == "Split" and "num_outputs" not in attrs and (len(node.inputs) < 2 or not node.inputs[1]):
            attrs["num_outputs"] = len(node.outputs)       # before opset 18: equal parts, one per output
        data = []
        for i, inp in enumerate(node.inputs):
            if not inp:
                continue
            if i in params:
                if inp not in self.consts:
                    raise op_param_invalid(inp, params[i], name, f"the [{params[i]}] input must be a constant (npusim's "
                                                                  f"{node.op} kernel takes it as an attribute)")
                if inp in self.tainted and (node.op, params[i]) != ("Reshape", "shape"):
                    raise op_param_invalid(inp, params[i], name, "it is computed from a dynamic (-1) input dim, which "
                                                                 "this parameter cannot take; give that input a static "
                                                                 "shape with --input_shape")
                arr = self.consts[inp]
                if arr.size:
                    attrs[params[i]] = param_value(node.op, params[i], arr)
                continue
            data.append(inp)
        if not data:
            raise _unsupported(name, node.op, "the node has no data input")
        if node.op == "Identity" or (node.op == "Dropout" and "Dropout" not in REGISTRY):
            self.values[node.outputs[0]] = self.value(data[0], name)
            return
        xs = [self.value(i, name) for i in data]
        if node.op == "Reshape" and "shape" in attrs:
            attrs["shape"] = self.reshape_target(xs[0], attrs["shape"])
        outs = [o for o in node.outputs if o]
        if node.op in OPTIONAL_OUTPUTS and not set(outs[OPTIONAL_OUTPUTS[node.op]:]) & self.used:
            outs = outs[:OPTIONAL_OUTPUTS[node.op]]
        out_names = [self.out_name(o) for o in outs]
        try:
            if node.op in REGISTRY:
                produced = len(infer(node.op, [x.spec for x in xs], attrs))
                out_names += [f"{name}:unused_output_{i}" for i in range(len(out_names), produced)]
                got = self.g.op(node.op, xs, outputs=out_names, name=name, **attrs)
                got = got if isinstance(got, tuple) else (got,)
            elif node.op in LOWERINGS:
                consts = [self.consts.get(i) if i else None for i in node.inputs]
                got = LOWERINGS[node.op](self.g, _Named(name), xs, attrs, out_names, consts)
                if got is None:
                    raise no_parser(name, node.op, self.graph.opset)
            else:
                raise no_parser(name, node.op, self.graph.opset)
        except AclError as exc:
            raise _unsupported(name, node.op, exc.message) from None
        except (TypeError, ValueError, OverflowError) as exc:   # attribute values a kernel cannot read
            raise _unsupported(name, node.op, f"{type(exc).__name__}: {exc}") from None
        self.values.update(zip(outs, got))

    def reshape_target(self, x, shape: list) -> list:
        """A target holding several -1s (a folded dynamic batch) copies dynamic dims in place with 0 instead."""
        if shape.count(-1) <= 1:
            return shape
        return [0 if d == -1 and i < len(x.shape) and x.shape[i] == -1 else d for i, d in enumerate(shape)]

    def out_name(self, onnx_name: str) -> str:
        return self.rename.get(onnx_name, onnx_name)

    # -- outputs ------------------------------------------------------------------------------------------

    def output_names(self) -> list[str]:
        if not self.options.out_nodes:
            return list(self.graph.outputs)
        by_node = {n.name: n for n in self.graph.nodes if n.name}
        names = []
        for node, index in self.options.out_nodes:
            if node not in by_node or index >= len(by_node[node].outputs):
                raise AtcError("E11017", f"Failed to find node [{node}:{index}] specified by --out_nodes.")
            names.append(by_node[node].outputs[index])
        return names

    def output_dtypes(self, outputs: list[str]) -> dict[str, str]:
        wanted = self.options.output_type
        if wanted is None:
            return {}
        if isinstance(wanted, str):
            return {o: wanted for o in outputs}
        by_node = {}
        for n in self.graph.nodes:
            for i, o in enumerate(n.outputs):
                by_node[(n.name, i)] = o
        out = {}
        for key, dtype in wanted.items():
            if key not in by_node or by_node[key] not in outputs:
                raise _not_found(f"{key[0]}:{key[1]}", "output_type")
            out[by_node[key]] = dtype
        return out

    def run(self) -> ModelDef:
        outputs = self.output_names()
        casts = self.output_dtypes(outputs)
        self.rename = {o: f"{o}:before_output_type" for o in casts}
        self.used = {i for n in self.graph.nodes for i in n.inputs} | set(outputs)
        try:
            self.declare_inputs()
            for index, node in enumerate(self.graph.nodes):
                name = self.unique_name(node, index)
                if not self.fold(node, name):
                    self.emit(node, name)
            return self.finish(outputs, casts)
        except AclError as exc:  # inputs, outputs and the whole graph's checks; nodes report their own
            raise _unsupported(self.g.name, "model", exc.message) from None

    def finish(self, outputs: list[str], casts: dict[str, str]) -> ModelDef:
        for o in outputs:
            v = self.value(o, "output")
            if o in casts and str(v.dtype) != casts[o]:
                v = self.g.op("Cast", [v], outputs=[o], name=f"{o}/output_type", to=casts[o])
            elif o in casts:
                v = self.g.op("Identity", [v], outputs=[o], name=f"{o}/output_type")
            self.g.output(o, v)
        if self.options.dynamic_batch_size:
            self.g.set_dynamic_batch(list(self.options.dynamic_batch_size))
        model = self.g.build()
        self.check_profiles(model)
        if self.options.dynamic_image_size:
            return dataclasses.replace(model, image_sizes=self.options.dynamic_image_size)
        if self.options.dynamic_dims:
            return dataclasses.replace(model, dims=self.options.dynamic_dims)
        return model

    def check_profiles(self, model: ModelDef) -> None:
        """Every --dynamic_image_size / --dynamic_dims profile must run through the graph."""
        per_input = bool(self.options.dynamic_image_size)       # (h, w) applies to every image input
        for profile in self.options.dynamic_image_size or self.options.dynamic_dims:
            values, shapes = iter(profile), []
            for v in model.inputs:
                if per_input:
                    values = iter(profile)
                shapes.append(tuple(next(values) if d == -1 else d for d in v.shape))
            try:
                infer_shapes(model, shapes)
            except AclError as exc:
                raise AtcError("E10001", f"Value [{','.join(map(str, profile))}] for parameter [--dynamic_image_size "
                                         f"or --dynamic_dims] is invalid. Reason: {exc.message}") from None


class _Named:
    """What a lowering needs of the node: its (unique) name."""

    def __init__(self, name: str):
        self.name = name


def convert(model, options: ConvertOptions | None = None, name: str | None = None) -> ModelDef:
    """Convert an ONNX model (a path) to a validated npusim ModelDef; refusals raise :class:`AtcError`."""
    if not isinstance(model, (str, os.PathLike)):
        raise AtcError("E10001", f"Value [{type(model).__name__}] for parameter [--model] is invalid. Reason: "
                                 f"expected the path of an ONNX file.")
    if options is not None and not isinstance(options, ConvertOptions):
        raise AtcError("E10001", f"Value [{type(options).__name__}] for parameter [options] is invalid. Reason: "
                                 f"expected rt.mdl.onnx.ConvertOptions (build one with parse_options).")
    path = os.fspath(model)
    graph = reader.load(path)
    name = name or os.path.splitext(os.path.basename(path))[0]
    return _Converter(graph, options or ConvertOptions(), name).run()
