"""Host-side offline-model API with pyACL names (``acl.mdl.*``), raising instead of returning codes.

A model is parsed on the host too (to fail fast and to know the concrete output dims of every
execution without a round trip), then loaded on the calling thread's current card, whose memory
holds its weights. Model ids are per process, like pyACL's; each maps to (card, card-side id).
Datasets and data buffers are small host objects describing device buffers.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading

from .. import args
from ..constants import AclErrorCode
from ..diag import slog
from ..errors import AclError
from ..host import devices, streams
from ..host.seam import SEAM, dev
from . import format as fmt
from .dataset import (
    DataBuffer,
    Dataset,
    _check_buffer,
    _check_dataset,
    add_dataset_buffer,
    create_data_buffer,
    create_dataset,
    destroy_data_buffer,
    destroy_dataset,
    get_data_buffer_addr,
    get_data_buffer_size,
    get_data_buffer_size_v2,
    get_dataset_buffer,
    get_dataset_num_buffers,
    update_data_buffer,
)
from .desc import (
    ModelDesc,
    _io,
    get_cur_output_dims,
    get_input_data_type,
    get_input_dims,
    get_input_format,
    get_input_index_by_name,
    get_input_name_by_index,
    get_input_size_by_index,
    get_num_inputs,
    get_num_outputs,
    get_output_data_type,
    get_output_dims,
    get_output_format,
    get_output_index_by_name,
    get_output_name_by_index,
    get_output_size_by_index,
)
from .shapes import check_gear, output_specs, resolve_input_shapes

INVALID = AclErrorCode.ACL_ERROR_INVALID_PARAM


class _Host:
    """The host runtime calls this module makes (one seam, so a test can put a fake card behind it)."""

    current_card = staticmethod(devices.current_card)
    stream_handle = staticmethod(streams.stream_handle)
    synchronize_stream = staticmethod(streams.synchronize_stream)


def _runtime():
    return _Host


# ---------------------------------------------------------------------------------------------
# loading and execution


@dataclasses.dataclass
class _HostModel:
    card: object
    card_model_id: int
    shapes: fmt.ModelDef  # the model without weight bytes: enough for shape inference
    desc: ModelDesc


_models: dict[int, _HostModel] = {}
_ids = itertools.count(1)
_lock = threading.Lock()


def load_from_mem(data) -> int:
    """Load a model from bytes onto the current device; returns the model id."""
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    model = fmt.parse(data)  # fail fast, on the host, before shipping the bytes
    card = _runtime().current_card()
    card_model_id, desc = card.call("model_load", data)
    shapes = dataclasses.replace(model, weights=tuple(dataclasses.replace(w, data=b"") for w in model.weights))
    with _lock:
        model_id = next(_ids)
        _models[model_id] = _HostModel(card, card_model_id, shapes, ModelDesc(model_id, desc))
    slog.info(slog.GE, "model %d (%r, %d bytes) loaded", model_id, model.name, len(data))
    return model_id


def load_from_file(path) -> int:
    """Load a model file onto the current device; returns the model id."""
    return load_from_mem(fmt.read_model_file(path))


def _model(model_id, what: str) -> _HostModel:
    with _lock:
        m = _models.get(model_id) if isinstance(model_id, int) else None
    if m is None:
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_MODEL_ID, f"{what}: model id {args.shown(model_id)} is not loaded in this process")
    return m


def get_model_def(model_id: int) -> fmt.ModelDef:
    """The loaded model's graph and value infos without its weight bytes (kept host-side for shape questions:
    gears, dynamic dims, sizes); AclError 100011 if ``model_id`` is not loaded in this process."""
    return _model(model_id, "get_model_def").shapes


def unload(model_id: int) -> None:
    """Unload the model and free its weights on the card."""
    m = _model(model_id, "unload")
    m.card.call("model_unload", m.card_model_id)
    with _lock:
        _models.pop(model_id, None)
    slog.info(slog.GE, "model %d unloaded", model_id)


def get_desc(model_id: int) -> ModelDesc:
    """The description of a loaded model (also carries the dims of its latest execution)."""
    return _model(model_id, "get_desc").desc


def set_dynamic_batch_size(model_id: int, dataset: Dataset, index: int, batch: int) -> None:
    """Choose the batch gear for executions with this input dataset."""
    m = _model(model_id, "set_dynamic_batch_size")
    _check_dataset(dataset, "set_dynamic_batch_size")
    _io(m.desc, index, "input", "set_dynamic_batch_size")
    if not m.shapes.batch_sizes:
        raise AclError(AclErrorCode.ACL_ERROR_MODEL_NOT_DYNAMIC,
                       f"set_dynamic_batch_size: model {m.desc.name!r} has no dynamic batch")
    if not args.is_int(batch) or batch not in m.shapes.batch_sizes:
        raise AclError(INVALID, f"set_dynamic_batch_size: batch {args.shown(batch)} is not one of the model's gears "
                                f"{list(m.shapes.batch_sizes)}")
    dataset.batch = int(batch)


def set_input_dynamic_dims(model_id: int, dataset: Dataset, index: int, dims) -> None:
    """Choose the concrete dims of input ``index`` (a list, or a ``{"dims": [...]}`` dict as aclmdlIODims)."""
    m = _model(model_id, "set_input_dynamic_dims")
    _check_dataset(dataset, "set_input_dynamic_dims")
    declared = _io(m.desc, index, "input", "set_input_dynamic_dims")["dims"]
    if isinstance(dims, dict):
        dims = dims.get("dims")
    dims = args.int_list(dims, "set_input_dynamic_dims", "dims", lo=0, hi=fmt.MAX_DIM)  # 2.5 / inf / "3" refused
    if len(dims) != len(declared) or any(w not in (-1, d) for d, w in zip(dims, declared)):
        raise AclError(INVALID, f"set_input_dynamic_dims: dims {dims} do not fit input {index}'s declared dims {declared}")
    check_gear(m.shapes, dims, index, "set_input_dynamic_dims")
    dataset.dims[index] = dims


def _prepare(model_id, inputs, outputs, what: str):
    """Synchronous checks of an execution; returns the card, its model id, buffers and dynamic choice."""
    m = _model(model_id, what)
    _check_dataset(inputs, what)
    _check_dataset(outputs, what)
    desc = m.desc
    if len(inputs.buffers) != len(desc.inputs):
        raise AclError(AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                       f"{what}: input dataset has {len(inputs.buffers)} buffers, "
                       f"model {desc.name!r} has {len(desc.inputs)} inputs")
    if len(outputs.buffers) != len(desc.outputs):
        raise AclError(AclErrorCode.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH,
                       f"{what}: output dataset has {len(outputs.buffers)} buffers, "
                       f"model {desc.name!r} has {len(desc.outputs)} outputs")
    for buf in inputs.buffers + outputs.buffers:
        _check_buffer(buf, what)
    in_shapes = resolve_input_shapes(m.shapes, inputs.batch, inputs.dims)
    out_specs = output_specs(m.shapes, in_shapes)
    for kind, bufs, infos, specs, code in (
            ("input", inputs.buffers, m.shapes.inputs, [(s, v.dtype) for s, v in zip(in_shapes, m.shapes.inputs)],
             AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH),
            ("output", outputs.buffers, m.shapes.outputs, [(s.shape, s.dtype) for s in out_specs],
             AclErrorCode.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH)):
        for i, (buf, info, (shape, dtype)) in enumerate(zip(bufs, infos, specs)):
            need = dtype.itemsize
            for d in shape:
                need *= d
            if buf.size < need:
                raise AclError(code, f"{what}: {kind} {i} ({info.name!r}) buffer has {buf.size} bytes, "
                                     f"{dtype}{list(shape)} needs {need}")
    dynamic = None
    if inputs.batch is not None or inputs.dims:
        dynamic = {}
        if inputs.batch is not None:
            dynamic["batch"] = inputs.batch
        if inputs.dims:
            dynamic["dims"] = {str(i): d for i, d in inputs.dims.items()}  # string keys survive strict msgpack
    ins = [[b.ptr, b.size] for b in inputs.buffers]
    outs = [[b.ptr, b.size] for b in outputs.buffers]
    desc.cur_output_dims = [list(s.shape) for s in out_specs]
    return m, ins, outs, dynamic


def output_shapes(model_id: int, inputs: Dataset) -> list[tuple[tuple[int, ...], object]]:
    """(shape, numpy dtype) of each output an execution with ``inputs`` (its batch, dims and tensor descs)
    produces: what a caller allocates for outputs whose size the model desc cannot say (a dynamic shape)."""
    m = _model(model_id, "output_shapes")
    _check_dataset(inputs, "output_shapes")
    in_shapes = resolve_input_shapes(m.shapes, inputs.batch, inputs.dims)
    return [(tuple(s.shape), s.dtype) for s in output_specs(m.shapes, in_shapes)]


def _submit(m: _HostModel, stream, ins, outs, dynamic, what: str):
    """Enqueue ``model_execute`` on the stream's card; returns the resolved stream."""
    st = _runtime().stream_handle(stream, what)  # None -> the current context's default stream
    client = st.ctx.client
    name = getattr(client, "name", None)  # contexts of one card have their own channels, same name
    if client is not m.card and (name is None or name != getattr(m.card, "name", None)):
        raise AclError(AclErrorCode.ACL_ERROR_RT_STREAM_CONTEXT,
                       f"{what}: model {m.desc.model_id} is loaded on {getattr(m.card, 'name', m.card)}, "
                       f"but the stream belongs to {getattr(client, 'name', client)}")
    # token 0: no dims reply wanted, the host already knows them from its own shape inference
    client.submit(st.id, "model_execute", m.card_model_id, ins, outs, dynamic)
    if SEAM.accesses:
        SEAM.enqueued(st, f"model {m.desc.model_id} ({m.desc.name!r}) execution", [dev(p, n) for p, n in ins],
                  [dev(p, n) for p, n in outs])
    return st


def execute_async(model_id: int, inputs: Dataset, outputs: Dataset, stream=None) -> None:
    """Enqueue an execution on ``stream``; failures inside it surface at the next synchronize."""
    m, ins, outs, dynamic = _prepare(model_id, inputs, outputs, "execute_async")
    _submit(m, stream, ins, outs, dynamic, "execute_async")


def execute(model_id: int, inputs: Dataset, outputs: Dataset) -> None:
    """Run the model and wait for it (on the current context's default stream)."""
    m, ins, outs, dynamic = _prepare(model_id, inputs, outputs, "execute")
    st = _submit(m, None, ins, outs, dynamic, "execute")
    _runtime().synchronize_stream(st)


__all__ = [
    "DataBuffer", "Dataset", "ModelDesc", "add_dataset_buffer", "create_data_buffer", "create_dataset",
    "destroy_data_buffer", "destroy_dataset", "execute", "execute_async", "get_cur_output_dims",
    "get_data_buffer_addr", "get_data_buffer_size", "get_data_buffer_size_v2", "get_dataset_buffer",
    "get_dataset_num_buffers", "get_desc", "get_input_data_type", "get_input_dims", "get_input_format",
    "get_input_index_by_name", "get_input_name_by_index", "get_input_size_by_index", "get_model_def",
    "get_num_inputs",
    "get_num_outputs", "get_output_data_type", "get_output_dims", "get_output_format",
    "get_output_index_by_name", "get_output_name_by_index", "get_output_size_by_index", "load_from_file",
    "load_from_mem", "output_shapes", "set_dynamic_batch_size", "set_input_dynamic_dims", "unload",
    "update_data_buffer",
]
