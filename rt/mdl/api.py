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

import numpy as np

from .. import args
from ..constants import AclErrorCode, Format
from ..errors import AclError
from . import format as fmt
from .executor import output_specs, resolve_input_shapes

INVALID = AclErrorCode.ACL_ERROR_INVALID_PARAM


def _runtime():
    from .. import api  # the lead's host runtime; imported late so rt.mdl loads without it
    return api


# ---------------------------------------------------------------------------------------------
# model descriptions


class ModelDesc:
    """What ``get_desc`` returns: the model's inputs/outputs and the dims of its latest execution."""

    def __init__(self, model_id: int, desc: dict):
        self.model_id = model_id
        self.name = desc["name"]
        self.inputs = desc["inputs"]
        self.outputs = desc["outputs"]
        self.batch_sizes = list(desc.get("batch_sizes", []))
        self.cur_output_dims = [list(o["dims"]) for o in self.outputs]

    def __repr__(self) -> str:
        return f"ModelDesc(id={self.model_id}, name={self.name!r}, inputs={len(self.inputs)}, outputs={len(self.outputs)})"


def _desc(desc, what: str) -> ModelDesc:
    if not isinstance(desc, ModelDesc):
        raise AclError(INVALID, f"{what}: {args.shown(desc)} is not a model desc (use get_desc(model_id))")
    return desc


def _io(desc: ModelDesc, i, which: str, what: str) -> dict:
    _desc(desc, what)
    items = desc.inputs if which == "input" else desc.outputs
    if not _is_index(i) or not 0 <= i < len(items):
        raise AclError(INVALID, f"{what}: index {i!r} out of range, model {desc.name!r} has {len(items)} {which}s")
    return items[i]


def _is_index(i) -> bool:
    return isinstance(i, (int, np.integer)) and not isinstance(i, bool)


def _dims(item: dict, dims) -> dict:
    return {"name": item["name"], "dimCount": len(dims), "dims": list(dims)}


def get_num_inputs(desc: ModelDesc) -> int:
    """Number of model inputs."""
    return len(_desc(desc, "get_num_inputs").inputs)


def get_num_outputs(desc: ModelDesc) -> int:
    """Number of model outputs."""
    return len(_desc(desc, "get_num_outputs").outputs)


def get_input_size_by_index(desc: ModelDesc, i: int) -> int:
    """Bytes the host must allocate for input ``i`` (largest batch gear; 0 if unbounded)."""
    return _io(desc, i, "input", "get_input_size_by_index")["size"]


def get_output_size_by_index(desc: ModelDesc, i: int) -> int:
    """Bytes the host must allocate for output ``i`` (largest batch gear; 0 if unbounded)."""
    return _io(desc, i, "output", "get_output_size_by_index")["size"]


def get_input_dims(desc: ModelDesc, i: int) -> dict:
    """``{"name", "dimCount", "dims"}`` of input ``i``; dynamic dims are -1."""
    item = _io(desc, i, "input", "get_input_dims")
    return _dims(item, item["dims"])


def get_output_dims(desc: ModelDesc, i: int) -> dict:
    """``{"name", "dimCount", "dims"}`` of output ``i``; dynamic dims are -1."""
    item = _io(desc, i, "output", "get_output_dims")
    return _dims(item, item["dims"])


def get_cur_output_dims(desc: ModelDesc, i: int) -> dict:
    """Output ``i``'s dims at the latest execution (declared dims before the first one)."""
    item = _io(desc, i, "output", "get_cur_output_dims")
    return _dims(item, desc.cur_output_dims[i])


def get_input_data_type(desc: ModelDesc, i: int) -> int:
    """aclDataType code of input ``i``."""
    return _io(desc, i, "input", "get_input_data_type")["acl_dtype"]


def get_output_data_type(desc: ModelDesc, i: int) -> int:
    """aclDataType code of output ``i``."""
    return _io(desc, i, "output", "get_output_data_type")["acl_dtype"]


def get_input_format(desc: ModelDesc, i: int) -> int:
    """aclFormat of input ``i`` (always ND here)."""
    _io(desc, i, "input", "get_input_format")
    return int(Format.ACL_FORMAT_ND)


def get_output_format(desc: ModelDesc, i: int) -> int:
    """aclFormat of output ``i`` (always ND here)."""
    _io(desc, i, "output", "get_output_format")
    return int(Format.ACL_FORMAT_ND)


def get_input_name_by_index(desc: ModelDesc, i: int) -> str:
    return _io(desc, i, "input", "get_input_name_by_index")["name"]


def get_output_name_by_index(desc: ModelDesc, i: int) -> str:
    return _io(desc, i, "output", "get_output_name_by_index")["name"]


def get_input_index_by_name(desc: ModelDesc, name: str) -> int:
    args.text(name, "get_input_index_by_name", "name")
    for i, item in enumerate(_desc(desc, "get_input_index_by_name").inputs):
        if item["name"] == name:
            return i
    raise AclError(INVALID, f"get_input_index_by_name: model {desc.name!r} has no input {name!r} "
                            f"(inputs: {[x['name'] for x in desc.inputs]})")


def get_output_index_by_name(desc: ModelDesc, name: str) -> int:
    args.text(name, "get_output_index_by_name", "name")
    for i, item in enumerate(_desc(desc, "get_output_index_by_name").outputs):
        if item["name"] == name:
            return i
    raise AclError(INVALID, f"get_output_index_by_name: model {desc.name!r} has no output {name!r} "
                            f"(outputs: {[x['name'] for x in desc.outputs]})")


# ---------------------------------------------------------------------------------------------
# data buffers and datasets


class DataBuffer:
    """A device buffer (address + size in bytes), as aclDataBuffer; destroying it frees nothing."""

    def __init__(self, ptr: int, size: int):
        self.ptr, self.size, self.destroyed = ptr, size, False

    def __repr__(self) -> str:
        return f"DataBuffer(ptr={self.ptr:#x}, size={self.size}{', destroyed' if self.destroyed else ''})"


class Dataset:
    """An ordered list of DataBuffers plus the dynamic batch / dims chosen for an execution."""

    def __init__(self):
        self.buffers: list[DataBuffer] = []
        self.batch: int | None = None
        self.dims: dict[int, list[int]] = {}
        self.destroyed = False

    def __repr__(self) -> str:
        return f"Dataset({len(self.buffers)} buffers{', destroyed' if self.destroyed else ''})"


def _check_buffer(buf, what: str) -> DataBuffer:
    if not isinstance(buf, DataBuffer) or buf.destroyed:
        raise AclError(INVALID, f"{what}: {buf!r} is not a live data buffer (create_data_buffer)")
    return buf


def _check_dataset(ds, what: str) -> Dataset:
    if not isinstance(ds, Dataset) or ds.destroyed:
        raise AclError(INVALID, f"{what}: {ds!r} is not a live dataset (create_dataset)")
    return ds


def _check_ptr_size(ptr, size, what: str) -> None:
    for name, v in (("ptr", ptr), ("size", size)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise AclError(INVALID, f"{what}: {name}={v!r}, expected a non-negative int")


def create_data_buffer(ptr: int, size: int) -> DataBuffer:
    """Describe ``size`` bytes of device memory at ``ptr``."""
    _check_ptr_size(ptr, size, "create_data_buffer")
    return DataBuffer(ptr, size)


def update_data_buffer(buf: DataBuffer, ptr: int, size: int) -> None:
    _check_buffer(buf, "update_data_buffer")
    _check_ptr_size(ptr, size, "update_data_buffer")
    buf.ptr, buf.size = ptr, size


def destroy_data_buffer(buf: DataBuffer) -> None:
    """Destroy the descriptor (the device memory stays allocated)."""
    _check_buffer(buf, "destroy_data_buffer").destroyed = True


def get_data_buffer_addr(buf: DataBuffer) -> int:
    return _check_buffer(buf, "get_data_buffer_addr").ptr


def get_data_buffer_size_v2(buf: DataBuffer) -> int:
    return _check_buffer(buf, "get_data_buffer_size_v2").size


get_data_buffer_size = get_data_buffer_size_v2  # deprecated name in pyACL


def create_dataset() -> Dataset:
    return Dataset()


def add_dataset_buffer(ds: Dataset, buf: DataBuffer) -> Dataset:
    """Append a buffer; returns the dataset (pyACL returns ``(dataset, ret)``)."""
    _check_dataset(ds, "add_dataset_buffer").buffers.append(_check_buffer(buf, "add_dataset_buffer"))
    return ds


def get_dataset_num_buffers(ds: Dataset) -> int:
    return len(_check_dataset(ds, "get_dataset_num_buffers").buffers)


def get_dataset_buffer(ds: Dataset, i: int) -> DataBuffer:
    buffers = _check_dataset(ds, "get_dataset_buffer").buffers
    if not _is_index(i) or not 0 <= i < len(buffers):
        raise AclError(INVALID, f"get_dataset_buffer: index {i!r} out of range, dataset has {len(buffers)} buffers")
    return buffers[i]


def destroy_dataset(ds: Dataset) -> None:
    """Destroy the dataset (its buffers stay alive)."""
    _check_dataset(ds, "destroy_dataset").destroyed = True


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
    return model_id


def load_from_file(path) -> int:
    """Load a model file onto the current device; returns the model id."""
    return load_from_mem(fmt.read_model_file(path))


def _model(model_id, what: str) -> _HostModel:
    with _lock:
        m = _models.get(model_id) if isinstance(model_id, int) else None
    if m is None:
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_MODEL_ID, f"{what}: model id {model_id!r} is not loaded in this process")
    return m


def unload(model_id: int) -> None:
    """Unload the model and free its weights on the card."""
    m = _model(model_id, "unload")
    m.card.call("model_unload", m.card_model_id)
    with _lock:
        _models.pop(model_id, None)


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
        raise AclError(INVALID, f"set_dynamic_batch_size: batch {batch!r} is not one of the model's gears "
                                f"{list(m.shapes.batch_sizes)}")
    dataset.batch = int(batch)


def set_input_dynamic_dims(model_id: int, dataset: Dataset, index: int, dims) -> None:
    """Choose the concrete dims of input ``index`` (a list, or a ``{"dims": [...]}`` dict as aclmdlIODims)."""
    m = _model(model_id, "set_input_dynamic_dims")
    _check_dataset(dataset, "set_input_dynamic_dims")
    declared = _io(m.desc, index, "input", "set_input_dynamic_dims")["dims"]
    if isinstance(dims, dict):
        dims = dims.get("dims")
    try:
        dims = [int(d) for d in dims]
    except (TypeError, ValueError):
        raise AclError(INVALID, f"set_input_dynamic_dims: dims {dims!r} is not a list of ints") from None
    if len(dims) != len(declared) or any(d < 0 or w not in (-1, d) for d, w in zip(dims, declared)):
        raise AclError(INVALID, f"set_input_dynamic_dims: dims {dims} do not fit input {index}'s declared dims {declared}")
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


def _submit(m: _HostModel, stream, ins, outs, dynamic, what: str):
    """Enqueue ``model_execute`` on the stream's card; returns the resolved stream."""
    runtime = _runtime()
    st = runtime._stream(stream, what)  # None -> the current context's default stream
    client = st.ctx.client
    name = getattr(client, "name", None)  # contexts of one card have their own channels, same name
    if client is not m.card and (name is None or name != getattr(m.card, "name", None)):
        raise AclError(AclErrorCode.ACL_ERROR_RT_STREAM_CONTEXT,
                       f"{what}: model {m.desc.model_id} is loaded on {getattr(m.card, 'name', m.card)}, "
                       f"but the stream belongs to {getattr(client, 'name', client)}")
    # token 0: no dims reply wanted, the host already knows them from its own shape inference
    client.submit(st.id, "model_execute", m.card_model_id, ins, outs, dynamic)
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
    "get_input_index_by_name", "get_input_name_by_index", "get_input_size_by_index", "get_num_inputs",
    "get_num_outputs", "get_output_data_type", "get_output_dims", "get_output_format",
    "get_output_index_by_name", "get_output_name_by_index", "get_output_size_by_index", "load_from_file",
    "load_from_mem", "set_dynamic_batch_size", "set_input_dynamic_dims", "unload", "update_data_buffer",
]
