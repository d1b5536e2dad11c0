"""``acl.mdl`` (and the data-buffer functions at ``acl``'s root): offline models as pyACL has them.

Model ids are ``rt.mdl``'s ints; descriptions, datasets and data buffers are int handles. pyACL's two-step
description (``desc = create_desc()``, ``get_desc(desc, model_id)``) fills a holder that stays live, so
``get_cur_output_dims`` sees later executions. A gear model (dynamic batch, image size or dims) shows CANN's
virtual input ``ascend_mbatch_shape_data`` after its real ones (``acl/_gears.py``): programs find it with
``get_input_index_by_name``, give it a buffer, and pass its index to ``set_dynamic_batch_size`` /
``set_dynamic_hw_size`` / ``set_input_dynamic_dims``; the facade strips that buffer at execution.
npusim loads its own model format whatever the file is called (``resnet50.om`` is fine); a real ATC ``.om``
is recognised and refused with a message saying to convert the ONNX model with npusim's ``atc`` (``docs/atc.md``).
"""

from __future__ import annotations

from rt import args, mdl
from rt.constants import AclErrorCode as E
from rt.constants import DataType, Format
from rt.errors import AclError

from . import _gears as gears
from ._core import HANDLES, code, plain, values
from ._hostptr import REGIONS
from ._tensor import drop_dataset_descs

DESC, DATASET, BUFFER = "model desc", "dataset", "data buffer"


class _Desc:
    """What create_desc makes and get_desc fills: rt's ModelDesc, plus what CANN's desc shows of the gears
    (``acl/_gears.py``): the virtual ``ascend_mbatch_shape_data`` input and largest-gear sizes."""

    def __init__(self):
        self.model = None                   # rt.mdl.ModelDesc once filled
        self.definition = None              # the model's definition (gears, shapes), weights stripped

    def fill(self, model_id, call: str) -> None:
        self.model = mdl.get_desc(model_id)
        self.definition = gears.model_def(model_id, call)

    def filled(self, call: str):
        if self.model is None:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: the desc is empty (fill it with acl.mdl.get_desc)")
        return self.model

    def inputs(self, call: str) -> list[dict]:
        virtual = gears.virtual_input(self.definition) if self.filled(call) else None
        return self.model.inputs + ([virtual] if virtual else [])

    def item(self, which: str, i, call: str) -> dict:
        items = self.inputs(call) if which == "input" else self.filled(call).outputs
        if not args.is_int(i) or not 0 <= i < len(items):
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: index {args.shown(i)} out of range, the model has "
                                                      f"{len(items)} {which}s")
        return items[int(i)]


def _desc(h, call) -> _Desc:
    return HANDLES.get(h, DESC, call, "a model desc (acl.mdl.create_desc)")


def _dataset(h, call):
    return HANDLES.get(h, DATASET, call, "a dataset (acl.mdl.create_dataset)")


def _buffer(h, call):
    return HANDLES.get(h, BUFFER, call, "a data buffer (acl.create_data_buffer)")


# ============================================================================ loading
@values("mdl.load_from_file", 0)
def load_from_file(model_path):
    return mdl.load_from_file(model_path)


@values("mdl.load_from_mem", 0)
def load_from_mem(model, model_size):
    """``model`` is a host address (or a bytes-like object) holding ``model_size`` bytes of the model."""
    if not args.is_int(model_size) or model_size <= 0:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"mdl.load_from_mem: size {args.shown(model_size)} must be positive")
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
        if model_size > len(data):
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"mdl.load_from_mem: size {model_size} exceeds the "
                                                      f"{len(data)} bytes given")
        return mdl.load_from_mem(data[:int(model_size)])
    if not args.is_int(model):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"mdl.load_from_mem: {args.shown(model)} is not a host address")
    return mdl.load_from_mem(REGIONS.view(int(model), int(model_size), "mdl.load_from_mem", "model",
                                          write=False).tobytes())


@plain("mdl.create_desc", 0)
def create_desc():
    return HANDLES.add(DESC, _Desc())


@code("mdl.get_desc")
def get_desc(model_desc, model_id):
    _desc(model_desc, "mdl.get_desc").fill(model_id, "mdl.get_desc")


@code("mdl.destroy_desc")
def destroy_desc(model_desc):
    _desc(model_desc, "mdl.destroy_desc")
    HANDLES.drop(model_desc)


# ============================================================================ descriptions
@plain("mdl.get_num_inputs", 0)
def get_num_inputs(model_desc):
    return len(_desc(model_desc, "mdl.get_num_inputs").inputs("mdl.get_num_inputs"))


@plain("mdl.get_num_outputs", 0)
def get_num_outputs(model_desc):
    return len(_desc(model_desc, "mdl.get_num_outputs").filled("mdl.get_num_outputs").outputs)


def _getter(which: str, field: str, default, call: str):
    @plain(call, default)
    def get(model_desc, index):
        return _desc(model_desc, call).item(which, index, call)[field]
    get.__name__ = call.split(".")[-1]
    return get


get_input_size_by_index = _getter("input", "size", 0, "mdl.get_input_size_by_index")
get_output_size_by_index = _getter("output", "size", 0, "mdl.get_output_size_by_index")
get_input_data_type = _getter("input", "acl_dtype", int(DataType.ACL_DT_UNDEFINED), "mdl.get_input_data_type")
get_output_data_type = _getter("output", "acl_dtype", int(DataType.ACL_DT_UNDEFINED), "mdl.get_output_data_type")
get_input_name_by_index = _getter("input", "name", "", "mdl.get_input_name_by_index")
get_output_name_by_index = _getter("output", "name", "", "mdl.get_output_name_by_index")


@plain("mdl.get_input_format", int(Format.ACL_FORMAT_UNDEFINED))
def get_input_format(model_desc, index):
    _desc(model_desc, "mdl.get_input_format").item("input", index, "mdl.get_input_format")
    return int(Format.ACL_FORMAT_ND)


@plain("mdl.get_output_format", int(Format.ACL_FORMAT_UNDEFINED))
def get_output_format(model_desc, index):
    _desc(model_desc, "mdl.get_output_format").item("output", index, "mdl.get_output_format")
    return int(Format.ACL_FORMAT_ND)


def _dims(item: dict, dims) -> dict:
    return {"name": item["name"], "dimCount": len(dims), "dims": list(dims)}


@values("mdl.get_input_dims", {})
def get_input_dims(model_desc, index):
    item = _desc(model_desc, "mdl.get_input_dims").item("input", index, "mdl.get_input_dims")
    return _dims(item, item["dims"])


@values("mdl.get_output_dims", {})
def get_output_dims(model_desc, index):
    item = _desc(model_desc, "mdl.get_output_dims").item("output", index, "mdl.get_output_dims")
    return _dims(item, item.get("max_dims", item["dims"]))      # CANN: the largest gear's dims


@values("mdl.get_cur_output_dims", {})
def get_cur_output_dims(model_desc, index):
    d = _desc(model_desc, "mdl.get_cur_output_dims")
    item = d.item("output", index, "mdl.get_cur_output_dims")
    return _dims(item, d.model.cur_output_dims[int(index)])


def _index_by_name(which: str, call: str):
    @values(call, -1)
    def find(model_desc, name):
        d = _desc(model_desc, call)
        name = args.text(name, call, "name")
        items = d.inputs(call) if which == "input" else d.filled(call).outputs
        for i, item in enumerate(items):
            if item["name"] == name:
                return i
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: [Get][Index]get index by name failed, cannot find "
                                                  f"tensor name[{name}] ({which}s: {[x['name'] for x in items]})")
    find.__name__ = call.split(".")[-1]
    return find


get_input_index_by_name = _index_by_name("input", "mdl.get_input_index_by_name")
get_output_index_by_name = _index_by_name("output", "mdl.get_output_index_by_name")


@values("mdl.get_dynamic_batch", {})
def get_dynamic_batch(model_desc):
    gears = list(_desc(model_desc, "mdl.get_dynamic_batch").filled("mdl.get_dynamic_batch").batch_sizes)
    return {"batchCount": len(gears), "batch": gears}


# ============================================================================ datasets and data buffers
@plain("create_data_buffer", 0)
def create_data_buffer(data, size):
    return HANDLES.add(BUFFER, mdl.create_data_buffer(data, size))


@code("destroy_data_buffer")
def destroy_data_buffer(data_buffer):
    mdl.destroy_data_buffer(_buffer(data_buffer, "destroy_data_buffer"))
    HANDLES.drop(data_buffer)


@code("update_data_buffer")
def update_data_buffer(data_buffer, data, size):
    mdl.update_data_buffer(_buffer(data_buffer, "update_data_buffer"), data, size)


@plain("get_data_buffer_addr", 0)
def get_data_buffer_addr(data_buffer):
    return mdl.get_data_buffer_addr(_buffer(data_buffer, "get_data_buffer_addr"))


@plain("get_data_buffer_size_v2", 0)
def get_data_buffer_size_v2(data_buffer):
    return mdl.get_data_buffer_size_v2(_buffer(data_buffer, "get_data_buffer_size_v2"))


get_data_buffer_size = get_data_buffer_size_v2       # deprecated in pyACL, still called


@plain("mdl.create_dataset", 0)
def create_dataset():
    return HANDLES.add(DATASET, mdl.create_dataset())


@values("mdl.add_dataset_buffer", 0)
def add_dataset_buffer(dataset, data_buffer):
    mdl.add_dataset_buffer(_dataset(dataset, "mdl.add_dataset_buffer"), _buffer(data_buffer, "mdl.add_dataset_buffer"))
    return dataset


@plain("mdl.get_dataset_num_buffers", 0)
def get_dataset_num_buffers(dataset):
    return mdl.get_dataset_num_buffers(_dataset(dataset, "mdl.get_dataset_num_buffers"))


@plain("mdl.get_dataset_buffer", 0)
def get_dataset_buffer(dataset, index):
    return HANDLES.add(BUFFER, mdl.get_dataset_buffer(_dataset(dataset, "mdl.get_dataset_buffer"), index))


@code("mdl.destroy_dataset")
def destroy_dataset(dataset):
    mdl.destroy_dataset(_dataset(dataset, "mdl.destroy_dataset"))
    HANDLES.drop(dataset)
    drop_dataset_descs(dataset)


@code("mdl.set_dynamic_batch_size")
def set_dynamic_batch_size(model_id, dataset, index, batch_size):
    """``index`` is the virtual ``ascend_mbatch_shape_data`` input's (as CANN has it) or a real input's."""
    desc = mdl.get_desc(model_id)
    if args.is_int(index) and index == len(desc.inputs) and desc.batch_sizes:
        index = 0
    mdl.set_dynamic_batch_size(model_id, _dataset(dataset, "mdl.set_dynamic_batch_size"), index, batch_size)


@code("mdl.set_input_dynamic_dims")
def set_input_dynamic_dims(model_id, dataset, index, dims):
    """``dims`` is a list or ``{"dimCount", "dims"}`` (aclmdlIODims). At a real input's index it is that input's
    shape; at the virtual input's index (CANN's form for an ``atc --dynamic_dims`` model) it is every input's
    shape, concatenated in input order, and must be one of the model's gears."""
    call = "mdl.set_input_dynamic_dims"
    ds = _dataset(dataset, call)
    model = gears.model_def(model_id, call)
    if not (args.is_int(index) and index == len(model.inputs) and gears.kind(model) == "dims"):
        mdl.set_input_dynamic_dims(model_id, ds, index, dims)
        return
    flat = args.int_list(dims.get("dims") if isinstance(dims, dict) else dims, call, "dims", lo=0)
    shapes, at = [], 0
    for v in model.inputs:
        shapes.append(flat[at:at + len(v.shape)])
        at += len(v.shape)
    chosen = tuple(d for v, shape in zip(model.inputs, shapes) for d, want in zip(shape, v.shape) if want == -1)
    if at != len(flat) or chosen not in gears.dims_gears(model):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: dims {flat} are not the inputs' shapes at one of the "
                                                  f"model's gears {[list(g) for g in gears.dims_gears(model)]}")
    for i, shape in enumerate(shapes):
        if -1 in model.inputs[i].shape:
            mdl.set_input_dynamic_dims(model_id, ds, i, shape)


__all__ = ["add_dataset_buffer", "create_dataset", "create_desc", "destroy_dataset", "destroy_desc", "get_cur_output_dims", "get_dataset_buffer", "get_dataset_num_buffers", "get_desc", "get_dynamic_batch", "get_input_data_type", "get_input_dims", "get_input_format", "get_input_index_by_name", "get_input_name_by_index", "get_input_size_by_index", "get_num_inputs", "get_num_outputs", "get_output_data_type", "get_output_dims", "get_output_format", "get_output_index_by_name", "get_output_name_by_index", "get_output_size_by_index", "load_from_file", "load_from_mem", "set_dynamic_batch_size", "set_input_dynamic_dims"]
