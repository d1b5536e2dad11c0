"""``acl.op``: single-operator execution as pyACL has it, run by the card's ONNX-named kernels.

The flow of CANN's single-operator samples: ``atc --singleop`` compiles each operator of a JSON list into an
op model (``0_Add_..._.om`` in an output directory); the program calls ``acl.op.set_model_dir(dir)`` (or
``acl.op.load(bytes, size)`` for one model), describes each input and output with ``acl.create_tensor_desc``,
wraps device memory in ``acl.create_data_buffer``, sets attributes on an ``acl.op.create_attr()`` handle and
calls ``acl.op.execute_v2(op_type, input_desc, inputs, output_desc, outputs, attr, stream)``.

As in CANN, ``execute_v2`` runs an operator only if a loaded op model matches it — the same op type, number
of inputs and outputs, data types, shapes (a model's -1 dim matches any size) and attributes; otherwise it
returns ``ACL_ERROR_OP_NOT_FOUND`` (100024) with CANN's "MatchOpModel ... fail" text. An op model here is an
npusim-om model (``rt/mdl/format.py``) of exactly one node whose inputs and outputs are the model's, in order
(what npusim's ``atc --singleop`` writes); a real ATC op model is skipped by ``set_model_dir`` (as CANN skips a
file it cannot parse) and refused by ``load``. ``compile_and_execute`` needs no model: it checks the operator
against the kernel library (CANN compiles it online) and runs it. Formats are not part of the match (an
npusim-om model does not record them); a desc in an AI Core blocked format is refused at execution.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from rt import args
from rt.constants import AclErrorCode as E
from rt.diag import slog
from rt.errors import AclError
from rt.files import FileRefused, check_path
from rt.host.tensor import Tensor, launch_kernel
from rt.kernels import cann, registry
from rt.mdl import format as fmt

from ._core import HANDLES, code, plain, stream_of, values
from ._hostptr import REGIONS
from ._mdl import _buffer
from ._op_attr import OpAttr, attr_of
from ._tensor import BLOCKED_FORMATS, FORMATS, TensorDesc, desc_of

OM_DIR_MAX_DEPTH = 3          # CANN lists op models this many directory levels deep
MAX_OP_MODELS = 10000         # CANN's default max_opqueue_num


class OpModel:
    """One loaded single-op model: what an execution must match."""

    def __init__(self, model: fmt.ModelDef, source: str):
        node = model.nodes[0]
        self.op_type, self.source = node.op, source
        self.inputs = [(np.dtype(v.dtype), list(v.shape)) for v in model.inputs]
        self.outputs = [(np.dtype(v.dtype), list(v.shape)) for v in model.outputs]
        self.attrs = _normal(node.attrs)

    def key(self):
        return self.op_type, repr(self.inputs), repr(self.outputs), repr(sorted(self.attrs.items()))

    def matches(self, kernel: str, ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict) -> bool:
        """Whether a call of ``kernel`` with these descs and (kernel, normalised) ``attrs`` is this model's: op
        models hold the card's kernel and its attributes (``rt/kernels/cann.py``), so CANN's spelling of the call
        and ATC's of the op list meet there."""
        return (kernel == self.op_type and _fits(self.inputs, ins) and _fits(self.outputs, outs)
                and attrs == self.attrs)


def _fits(declared, descs: list[TensorDesc]) -> bool:
    if len(declared) != len(descs):
        return False
    for (dtype, shape), d in zip(declared, descs):
        if d.acl_dtype < 0 or d.dtype != dtype:
            return False
        if shape != [-2] and (len(shape) != len(d.dims) or any(s not in (-1, x) for s, x in zip(shape, d.dims))):
            return False
    return True


def _normal(attrs: dict) -> dict:
    """Attribute values compared as C would see them: floats as float32, tuples as lists."""
    def one(v):
        if isinstance(v, (list, tuple)):
            return [one(x) for x in v]
        if isinstance(v, float):
            return float(np.float32(v))
        return v
    return {k: one(v) for k, v in attrs.items()}


class _OpModels:
    """The op models this process loaded (CANN: per process, kept until the process ends)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._models: dict[tuple, OpModel] = {}

    def add(self, model: OpModel) -> None:
        with self._lock:
            if len(self._models) >= MAX_OP_MODELS and model.key() not in self._models:
                self._models.pop(next(iter(self._models)))           # CANN ages out the oldest
            self._models[model.key()] = model

    def find(self, op_type: str, ins, outs, attrs) -> OpModel | None:
        with self._lock:
            return next((m for m in self._models.values() if m.matches(op_type, ins, outs, attrs)), None)

    def __len__(self):
        return len(self._models)


OP_MODELS = _OpModels()


def _single_op(data: bytes, source: str) -> OpModel:
    """An OpModel from npusim-om bytes; 100013 if they are not a one-node model over its own inputs."""
    model = fmt.parse(data)
    if len(model.nodes) != 1 or list(model.nodes[0].inputs) != [v.name for v in model.inputs] or \
            list(model.nodes[0].outputs) != [v.name for v in model.outputs]:
        raise AclError(E.ACL_ERROR_PARSE_MODEL, f"{source}: model {model.name!r} is not a single-operator model "
                                                f"(one node whose inputs and outputs are the model's, in order; "
                                                f"it has {len(model.nodes)} nodes)")
    return OpModel(model, source)


def _om_files(top: str, depth: int, out: list[str]) -> None:
    try:
        names = sorted(os.listdir(top))
    except OSError as e:
        raise AclError(E.ACL_ERROR_READ_MODEL_FAILURE, f"op.set_model_dir: [Scan][Dir]scan dir failed. path = "
                                                       f"{top}: {e.strerror or e}") from None
    for name in names:
        path = os.path.join(top, name)
        if os.path.isdir(path) and depth > 1:
            _om_files(path, depth - 1, out)
        elif name.endswith(".om") and os.path.isfile(path):
            out.append(path)


@code("op.set_model_dir")
def set_model_dir(model_dir):
    """Load every single-op model (``*.om``, up to three directory levels down) of ``model_dir``. A file that
    is not one (a real ATC op model, a graph model) is skipped with a warning in the plog, as CANN skips it;
    a directory with none loads nothing and succeeds (CANN warns "No model is loaded")."""
    try:
        top = check_path(model_dir, "op.set_model_dir")
    except FileRefused as e:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, e.message) from None
    files: list[str] = []
    _om_files(top, OM_DIR_MAX_DEPTH, files)
    loaded = 0
    for path in files:
        try:
            OP_MODELS.add(_single_op(fmt.read_model_file(path), path))
            loaded += 1
        except AclError as e:
            slog.warning(slog.ASCENDCL, "can not parse model, errorCode = %d, model = %s, skip it: %s", e.code, path,
                         e.message)
    if not loaded:
        slog.warning(slog.ASCENDCL, "No model is loaded. (op.set_model_dir %s: %d .om files)", top, len(files))


@code("op.load")
def load(model, model_size):
    """One single-op model from memory: a host address (or a bytes-like object) holding ``model_size`` bytes."""
    if not args.is_int(model_size) or model_size <= 0:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"op.load: model_size {args.shown(model_size)} must be positive")
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
        if model_size > len(data):
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"op.load: model_size {model_size} exceeds the {len(data)} "
                                                      f"bytes given")
        data = data[:int(model_size)]
    elif args.is_int(model):
        data = REGIONS.view(int(model), int(model_size), "op.load", "model", write=False).tobytes()
    else:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"op.load: model {args.shown(model)} is not a host address")
    OP_MODELS.add(_single_op(data, f"op.load({model_size} bytes)"))


# ---------------------------------------------------------------------------------------------- execution
def _operands(call, input_desc, inputs, output_desc, outputs):
    """(input descs, input buffers, output descs, output buffers), checked for kind and matching lengths."""
    lists = []
    for name, value in (("input_desc", input_desc), ("inputs", inputs), ("output_desc", output_desc),
                        ("outputs", outputs)):
        lists.append(args.sequence(value, call, name))
    if len(lists[0]) != len(lists[1]) or len(lists[2]) != len(lists[3]):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {len(lists[0])} input descs for {len(lists[1])} inputs, "
                                                  f"{len(lists[2])} output descs for {len(lists[3])} outputs")
    return ([desc_of(h, call) for h in lists[0]], [_buffer(h, call) for h in lists[1]],
            [desc_of(h, call) for h in lists[2]], [_buffer(h, call) for h in lists[3]])


def _attrs(attr, call) -> dict:
    if attr is None or args.is_int(attr) and attr == 0:
        return {}
    a: OpAttr = attr_of(attr, call)
    return dict(a.values)


def _present(descs, bufs, call):
    """Drop trailing optional inputs (desc of ACL_DT_UNDEFINED, CANN's marker for an unused optional input)."""
    while descs and descs[-1].acl_dtype < 0:
        descs, bufs = descs[:-1], bufs[:-1]
    if any(d.acl_dtype < 0 for d in descs):
        raise AclError(E.ACL_ERROR_OP_INPUT_NOT_MATCH, f"{call}: only trailing optional inputs may be left out "
                                                       f"(ACL_DT_UNDEFINED) for npusim's kernels")
    return descs, bufs


def _tensors(call, role, descs, bufs) -> list[Tensor]:
    out = []
    for i, (d, b) in enumerate(zip(descs, bufs)):
        where = f"{call}: {role} {i} ({d.describe()})"
        if d.format in BLOCKED_FORMATS:
            raise AclError(E.ACL_ERROR_FORMAT_NOT_MATCH, f"{where}: format {BLOCKED_FORMATS[d.format]} is an AI Core "
                                                         f"layout; npusim's kernels take plain layouts "
                                                         f"({', '.join(sorted(set(FORMATS.values()) - set(BLOCKED_FORMATS.values()) - {'UNDEFINED'}))})")
        if not d.static:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{where}: [Check][Op]TensorDesc must be static when executing")
        if d.placement != 0:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{where}: host-placed tensors (set_tensor_place_ment) are not "
                                                      f"supported by npusim; copy the data to device memory")
        if b.size < d.nbytes():
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{where}: data buffer has {b.size} bytes, the desc needs "
                                                      f"{d.nbytes()}")
        out.append(Tensor(b.ptr, d.dims, d.dtype))
    return out


def _kernel(call, op_type, attrs: dict, n_inputs: int) -> tuple[str, dict]:
    """The card's kernel for CANN operator ``op_type`` and its attributes (``rt/kernels/cann.py``)."""
    try:
        return cann.to_kernel(op_type, attrs, n_inputs)
    except AclError as exc:
        raise AclError(exc.code, f"{call}: {exc.message}") from None


def _run(call, op_type, in_descs, in_bufs, out_descs, out_bufs, attrs, stream) -> None:
    """Launch the kernel of ``op_type`` on ``stream`` after checking the outputs the descs promise."""
    name, attrs = _kernel(call, op_type, attrs, len(in_descs))
    opdef = registry.get_op(name)
    st = stream_of(stream, call)
    ins = _tensors(call, "input", in_descs, in_bufs)
    outs = _tensors(call, "output", out_descs, out_bufs)
    specs = registry.infer(opdef.name, [t.spec() for t in ins], attrs)
    if len(specs) != len(outs):
        raise AclError(E.ACL_ERROR_OP_OUTPUT_NOT_MATCH, f"{call}: {op_type} has {len(specs)} outputs, "
                                                        f"{len(outs)} output descs were given")
    for i, (spec, t) in enumerate(zip(specs, outs)):
        if tuple(spec.shape) != tuple(t.shape) or np.dtype(spec.dtype) != t.dtype:
            raise AclError(E.ACL_ERROR_OP_OUTPUT_NOT_MATCH, f"{call}: {op_type} output {i} is {spec.dtype}"
                                                            f"{list(spec.shape)}, its desc says {t.dtype}{list(t.shape)}")
    launch_kernel(opdef.name, ins, outs, attrs, stream=st)


def _execute(call, op_type, input_desc, inputs, output_desc, outputs, attr, stream):
    op_type = args.text(op_type, call, "op_type")
    in_descs, in_bufs, out_descs, out_bufs = _operands(call, input_desc, inputs, output_desc, outputs)
    attrs = _attrs(attr, call)
    in_descs, in_bufs = _present(in_descs, in_bufs, call)
    kernel, kernel_attrs = _kernel(call, op_type, attrs, len(in_descs))
    if OP_MODELS.find(kernel, in_descs, out_descs, _normal(kernel_attrs)) is None:
        raise _not_matched(call, op_type, in_descs, attrs)
    _run(call, op_type, in_descs, in_bufs, out_descs, out_bufs, attrs, stream)


@code("op.execute_v2")
def execute_v2(op_type, input_desc, inputs, output_desc, outputs, attr, stream):
    """Run a loaded single-op model's operator on ``stream`` (asynchronous: synchronize the stream)."""
    _execute("op.execute_v2", op_type, input_desc, inputs, output_desc, outputs, attr, stream)


@code("op.execute")
def execute(op_type, input_desc, inputs, output_desc, outputs, attr, stream):
    """Deprecated in pyACL in favour of execute_v2; the same here."""
    _execute("op.execute", op_type, input_desc, inputs, output_desc, outputs, attr, stream)


OP_HANDLE = "op handle"


class OpHandle:
    """What ``create_handle`` fixed: the operator, its descs and attributes, matched against the loaded op models
    once (CANN's aclopHandle); ``execute_with_handle`` gives only the buffers and the stream."""

    def __init__(self, op_type: str, in_descs: list, out_descs: list, attrs: dict):
        self.op_type, self.in_descs, self.out_descs, self.attrs = op_type, in_descs, out_descs, attrs


def _not_matched(call, op_type, in_descs, attrs) -> AclError:
    shown = ", ".join(d.describe() for d in in_descs)
    return AclError(E.ACL_ERROR_OP_NOT_FOUND,
                    f"{call}: [Match][OpModel]MatchOpModel opName = {op_type} fail from static map or dynamic map. "
                    f"Please make sure the op executed and the op compiled is matched, you can check the op type, "
                    f"op inputs number, outputs number, input format, origin format, datatype, memtype, attr, dim "
                    f"range, and so on. (inputs: {shown}; attrs: {attrs}; {len(OP_MODELS)} op models loaded: "
                    f"acl.op.set_model_dir / acl.op.load)")


@values("op.create_handle", 0)
def create_handle(op_type, input_desc, output_desc, op_attr):
    """A handle to run ``op_type`` with these descs and attributes again and again (``execute_with_handle``); a
    loaded op model must match, as for ``execute_v2`` (else 100024)."""
    call = "op.create_handle"
    op_type = args.text(op_type, call, "op_type")
    ins = [desc_of(h, call) for h in args.sequence(input_desc, call, "input_desc")]
    outs = [desc_of(h, call) for h in args.sequence(output_desc, call, "output_desc")]
    attrs = _attrs(op_attr, call)
    ins, _ = _present(ins, ins, call)
    kernel, kernel_attrs = _kernel(call, op_type, attrs, len(ins))
    if OP_MODELS.find(kernel, ins, outs, _normal(kernel_attrs)) is None:
        raise _not_matched(call, op_type, ins, attrs)
    return HANDLES.add(OP_HANDLE, OpHandle(op_type, ins, outs, attrs))


@code("op.execute_with_handle")
def execute_with_handle(handle, inputs, outputs, stream):
    """Run the operator of ``handle`` on ``inputs`` into ``outputs`` (data buffers, in the descs' order) on
    ``stream`` (asynchronous: synchronize the stream)."""
    call = "op.execute_with_handle"
    h: OpHandle = HANDLES.get(handle, OP_HANDLE, call, "an op handle (acl.op.create_handle)")
    in_bufs = [_buffer(b, call) for b in args.sequence(inputs, call, "inputs")]
    out_bufs = [_buffer(b, call) for b in args.sequence(outputs, call, "outputs")]
    if len(in_bufs) < len(h.in_descs) or len(out_bufs) != len(h.out_descs):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: the handle's {h.op_type} takes {len(h.in_descs)} inputs and "
                                                  f"{len(h.out_descs)} outputs, {len(in_bufs)} and {len(out_bufs)} "
                                                  f"data buffers were given")
    _run(call, h.op_type, h.in_descs, in_bufs[:len(h.in_descs)], h.out_descs, out_bufs, h.attrs, stream)


@plain("op.destroy_handle", None)
def destroy_handle(handle):
    """Nothing is returned (aclopDestroyHandle is void); a bad handle is recorded for get_recent_err_msg."""
    HANDLES.get(handle, OP_HANDLE, "op.destroy_handle", "an op handle (acl.op.create_handle)")
    HANDLES.drop(handle)


ENGINES = {0: "ACL_ENGINE_SYS", 1: "ACL_ENGINE_AICORE", 2: "ACL_ENGINE_VECTOR"}
COMPILE_SYS, COMPILE_UNREGISTERED = 0, 1


def _compile_args(call, engine_type, compile_flag, op_path):
    if not args.is_int(engine_type) or int(engine_type) not in ENGINES:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: engine_type {args.shown(engine_type)} is not one of "
                                                  f"{ENGINES}")
    if not args.is_int(compile_flag) or int(compile_flag) not in (COMPILE_SYS, COMPILE_UNREGISTERED):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: compile_flag {args.shown(compile_flag)} is not 0 "
                                                  f"(ACL_COMPILE_SYS) or 1 (ACL_COMPILE_UNREGISTERED)")
    if op_path is not None and not isinstance(op_path, str):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: op_path {args.shown(op_path)} is not a str")
    if compile_flag == COMPILE_UNREGISTERED:
        raise AclError(E.ACL_ERROR_OP_NOT_FOUND, f"{call}: ACL_COMPILE_UNREGISTERED compiles a TBE operator from its "
                                                 f".py in {op_path!r}; npusim runs only its built-in kernels")


@code("op.compile_and_execute")
def compile_and_execute(op_type, input_desc, inputs, output_desc, outputs, attr, engine_type, compile_flag,
                        op_path, stream):
    """Online compile and run: the operator runs on the kernel of the same (ONNX) name, no op model needed."""
    call = "op.compile_and_execute"
    _compile_args(call, engine_type, compile_flag, op_path)
    op_type = args.text(op_type, call, "op_type")
    in_descs, in_bufs, out_descs, out_bufs = _operands(call, input_desc, inputs, output_desc, outputs)
    in_descs, in_bufs = _present(in_descs, in_bufs, call)
    _run(call, op_type, in_descs, in_bufs, out_descs, out_bufs, _attrs(attr, call), stream)


compile_and_execute_v2 = compile_and_execute


@code("op.compile")
def compile(op_type, input_desc, output_desc, attr, engine_type, compile_flag, op_path):
    """Online compile without running: the operator must exist in the kernel library and accept these inputs
    and attributes; the descs are then usable with execute_v2, as CANN registers the compiled op model."""
    call = "op.compile"
    _compile_args(call, engine_type, compile_flag, op_path)
    op_type = args.text(op_type, call, "op_type")
    ins = [desc_of(h, call) for h in args.sequence(input_desc, call, "input_desc")]
    outs = [desc_of(h, call) for h in args.sequence(output_desc, call, "output_desc")]
    ins, _ = _present(ins, ins, call)
    name, attrs = _kernel(call, op_type, _attrs(attr, call), len(ins))
    opdef = registry.get_op(name)
    registry.infer(opdef.name, [registry.TensorSpec(tuple(d.dims), d.dtype) for d in ins], attrs)
    model = fmt.ModelDef(
        name=f"compiled_{op_type}",
        inputs=tuple(fmt.ValueInfo(f"x{i}", d.dtype, tuple(d.dims)) for i, d in enumerate(ins)),
        outputs=tuple(fmt.ValueInfo(f"y{i}", d.dtype, tuple(d.dims)) for i, d in enumerate(outs)),
        nodes=(fmt.Node(opdef.name, op_type, tuple(f"x{i}" for i in range(len(ins))),
                        tuple(f"y{i}" for i in range(len(outs))), dict(attrs)),),
        weights=(), batch_sizes=())
    OP_MODELS.add(OpModel(model, f"op.compile({op_type})"))


__all__ = ["compile", "compile_and_execute", "compile_and_execute_v2", "create_handle", "destroy_handle", "execute",
           "execute_v2", "execute_with_handle", "load", "set_model_dir"]
