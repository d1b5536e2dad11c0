"""``acl.mdl`` beyond load/describe/execute: loading into the program's own memory (``*_with_mem``), sizes
(``query_size``, ``query_size_from_mem``), dynamic image sizes (``get_dynamic_hw``, ``set_dynamic_hw_size``),
``get_input_dims_v2`` and AIPP.

Work and weight memory: CANN's samples ask ``query_size`` how much device memory a model needs, ``malloc`` it
and load with ``load_from_file_with_mem``. npusim reports the weights' bytes and, as the work size, the bytes
of the model's intermediate values at its largest gear (at least ``MIN_WORK_BYTES``, so the program's
``malloc`` of it succeeds); the memory given is checked (device memory, at least the sizes asked for) and the
model keeps its own copy on the card, as npusim's model store holds weights apart from the program's heap.

Dynamic image size and dims: ``get_dynamic_hw`` / ``get_input_dynamic_gear_count`` / ``get_input_dynamic_dims``
report the model's gears (``atc --dynamic_image_size`` / ``--dynamic_dims``, ``acl/_gears.py``);
``set_dynamic_hw_size`` chooses one. AIPP: no npusim model has an AIPP input (ATC's ``insert_op_conf``), so
the AIPP handle functions work and applying one to a model is refused with CANN's codes for a model without
dynamic AIPP.
"""

from __future__ import annotations

from rt import args, mdl
from rt.addresses import decode_addr
from rt.constants import AclErrorCode as E
from rt.errors import AclError
from rt.mdl import format as fmt
from rt.mdl.shapes import infer_shapes, max_input_shapes

from . import _gears as gears
from ._core import HANDLES, code, plain, values
from ._hostptr import REGIONS
from ._mdl import _dataset, _desc, _dims

MIN_WORK_BYTES = 32                     # one aligned block: what the card plans for even a model of no intermediates
ACL_INVALID_NODE_INDEX = 0xFFFFFFFF
ACL_DATA_WITHOUT_AIPP = 0
ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID = 145013
ACL_ERROR_GE_AIPP_NOT_EXIST = 145015


def _work_bytes(model: fmt.ModelDef) -> int:
    """Bytes of every node output that is not a model output, at the largest gear (aligned to 32 bytes)."""
    profiles = getattr(model, "image_sizes", ()) or getattr(model, "dims", ())
    if profiles:
        candidates = [gears.profile_shapes(model, p) for p in profiles]
    else:
        shapes = max_input_shapes(model)
        candidates = [] if shapes is None else [shapes]   # free dynamic dims: no bound to plan for
    outputs = {v.name for v in model.outputs}
    best = 0
    for shapes in candidates:
        specs = infer_shapes(model, shapes)
        total = 0
        for node in model.nodes:
            for name in node.outputs:
                if name not in outputs:
                    s = specs[name]
                    n = s.dtype.itemsize
                    for d in s.shape:
                        n *= d
                    total += (n + 31) // 32 * 32
        best = max(best, total)
    return max(best, MIN_WORK_BYTES)


def _model_bytes(model, model_size, call: str) -> bytes:
    if not args.is_int(model_size) or model_size <= 0:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: model_size {args.shown(model_size)} must be positive")
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
        if model_size > len(data):
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: model_size {model_size} exceeds the {len(data)} "
                                                      f"bytes given")
        return data[:int(model_size)]
    if not args.is_int(model):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: model {args.shown(model)} is not a host address")
    return REGIONS.view(int(model), int(model_size), call, "model", write=False).tobytes()


def _sizes(data: bytes) -> tuple[int, int]:
    model = fmt.parse(data)
    return _work_bytes(model), model.weight_bytes


@values("mdl.query_size", 0, 0)
def query_size(model_path):
    """``(work_size, weight_size, ret)``: device memory for the model's intermediates and its weights."""
    return _sizes(fmt.read_model_file(model_path))


@values("mdl.query_size_from_mem", 0, 0)
def query_size_from_mem(model, model_size):
    return _sizes(_model_bytes(model, model_size, "mdl.query_size_from_mem"))


def _check_mem(call: str, data: bytes, work_ptr, work_size, weight_ptr, weight_size) -> None:
    """The program's work and weight memory: 0 (CANN manages it then) or device memory of the size needed."""
    need_work, need_weight = _sizes(data)
    for what, ptr, size, need in (("work", work_ptr, work_size, need_work), ("weight", weight_ptr, weight_size,
                                                                             need_weight)):
        if not args.is_int(ptr) or not args.is_int(size) or size < 0:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {what}_ptr {args.shown(ptr)} and {what}_size "
                                                      f"{args.shown(size)} must be ints")
        if ptr == 0:
            continue
        if decode_addr(int(ptr)) is None:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {what}_ptr 0x{int(ptr):x} is not device memory "
                                                      f"(acl.rt.malloc)")
        if size < need:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {what}_size {size} is less than the {need} bytes "
                                                      f"acl.mdl.query_size reports for the model")


@values("mdl.load_from_file_with_mem", 0)
def load_from_file_with_mem(model_path, work_ptr, work_size, weight_ptr, weight_size):
    data = fmt.read_model_file(model_path)
    _check_mem("mdl.load_from_file_with_mem", data, work_ptr, work_size, weight_ptr, weight_size)
    return mdl.load_from_mem(data)


@values("mdl.load_from_mem_with_mem", 0)
def load_from_mem_with_mem(model, model_size, work_ptr, work_size, weight_ptr, weight_size):
    data = _model_bytes(model, model_size, "mdl.load_from_mem_with_mem")
    _check_mem("mdl.load_from_mem_with_mem", data, work_ptr, work_size, weight_ptr, weight_size)
    return mdl.load_from_mem(data)


# ---------------------------------------------------------------------------------------------- dynamic shapes
@values("mdl.get_dynamic_hw", {"hwCount": 0, "hw": []})
def get_dynamic_hw(model_desc, index):
    """``({"hwCount", "hw": [[h, w], ...]}, ret)``: the model's image-size gears (``atc --dynamic_image_size``);
    ``index`` is reserved (-1). A model without them has ``hwCount`` 0, as on CANN."""
    d = _desc(model_desc, "mdl.get_dynamic_hw")
    d.filled("mdl.get_dynamic_hw")
    if not args.is_int(index):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"mdl.get_dynamic_hw: index {args.shown(index)} is not an int "
                                                  f"(reserved: pass -1)")
    hw = gears.hw_gears(d.definition)
    return {"hwCount": len(hw), "hw": hw}


@values("mdl.get_input_dynamic_gear_count", 0)
def get_input_dynamic_gear_count(model_desc, index):
    """The number of ``atc --dynamic_dims`` gears (0 for any other model); ``index`` is reserved (-1)."""
    d = _desc(model_desc, "mdl.get_input_dynamic_gear_count")
    d.filled("mdl.get_input_dynamic_gear_count")
    if not args.is_int(index):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"mdl.get_input_dynamic_gear_count: index {args.shown(index)} is "
                                                  f"not an int (reserved: pass -1)")
    return len(gears.dims_gears(d.definition))


@values("mdl.get_input_dynamic_dims", [])
def get_input_dynamic_dims(model_desc, index, gear_count):
    """``([{"name", "dimCount", "dims"}, ...], ret)``: per gear, every input's shape concatenated (what
    ``set_input_dynamic_dims`` takes at the virtual input's index); ``gear_count`` must be the model's."""
    call = "mdl.get_input_dynamic_dims"
    d = _desc(model_desc, call)
    d.filled(call)
    model = d.definition
    if not args.is_int(index) or not args.is_int(gear_count) or gear_count != len(gears.dims_gears(model)):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: gear_count {args.shown(gear_count)} is not the model's "
                                                  f"{len(gears.dims_gears(model))} (get_input_dynamic_gear_count)")
    out = []
    for g in gears.dims_gears(model):
        flat = [x for shape in gears.profile_shapes(model, g) for x in shape]
        out.append({"name": "", "dimCount": len(flat), "dims": flat})
    return out


def _hw_dims(dims: list[int]) -> tuple[int, int] | None:
    """Where the free height and width of a 4-D input are: (2, 3) for NCHW, (1, 2) for NHWC."""
    if len(dims) != 4 or dims.count(-1) != 2:
        return None
    if dims[2] == dims[3] == -1:
        return 2, 3
    if dims[1] == dims[2] == -1:
        return 1, 2
    return None


@code("mdl.set_dynamic_hw_size")
def set_dynamic_hw_size(model_id, dataset, index, height, width):
    """Set the height and width of every input whose two spatial dims are -1 for executions with ``dataset``
    (``index`` names the virtual input ``ascend_mbatch_shape_data``, as on CANN, or a real input). A model
    with image-size gears takes only one of them; one built with free -1 dims takes any size."""
    call = "mdl.set_dynamic_hw_size"
    ds = _dataset(dataset, call)
    desc = mdl.get_desc(model_id)
    model = gears.model_def(model_id, call)
    if not args.is_int(index) or not 0 <= index <= len(desc.inputs):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: index {args.shown(index)} out of range, the model has "
                                                  f"{len(desc.inputs)} inputs")
    for name, v in (("height", height), ("width", width)):
        if not args.is_int(v) or v <= 0:
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: [Check][Params] {name} {args.shown(v)} must be a "
                                                      f"positive int")
    hw = gears.hw_gears(model)
    if hw and [int(height), int(width)] not in hw:
        raise AclError(ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID, f"{call}: [Set][DynamicSize] set dynamic HW size "
                                                                f"failed: {height}x{width} is not one of the model's "
                                                                f"gears {hw}")
    done = 0
    for i, item in enumerate(desc.inputs):
        where = _hw_dims(list(item["dims"]))
        if where is not None:
            dims = list(item["dims"])
            dims[where[0]], dims[where[1]] = int(height), int(width)
            mdl.set_input_dynamic_dims(model_id, ds, i, dims)
            done += 1
    if not done:
        raise AclError(ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID,
                       f"{call}: [Set][DynamicSize] set dynamic HW size failed: model {desc.name!r} has no input with "
                       f"dynamic height and width (inputs: {[x['dims'] for x in desc.inputs]})")


@values("mdl.get_input_dims_v2", {})
def get_input_dims_v2(model_desc, index):
    """As get_input_dims: npusim's inputs are ND, so the format-aware dims are the same."""
    item = _desc(model_desc, "mdl.get_input_dims_v2").item("input", index, "mdl.get_input_dims_v2")
    return _dims(item, item["dims"])


@plain("mdl.get_op_attr", None)
def get_op_attr(model_desc, op_name, attr):
    """CANN supports one attribute here, ``_datadump_original_op_names`` (the operators ATC fused into one);
    npusim fuses nothing, so the value is the empty string CANN gives for an operator without it."""
    _desc(model_desc, "mdl.get_op_attr").filled("mdl.get_op_attr")
    args.text(op_name, "mdl.get_op_attr", "op_name")
    args.text(attr, "mdl.get_op_attr", "attr")
    return ""


# ---------------------------------------------------------------------------------------------- AIPP
AIPP = "aipp set"


class _Aipp:
    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self.params: dict[str, tuple] = {}


@plain("mdl.create_aipp", 0)
def create_aipp(batch_size):
    return HANDLES.add(AIPP, _Aipp(args.integer(batch_size, "mdl.create_aipp", "batch_size", lo=1)))


@code("mdl.destroy_aipp")
def destroy_aipp(aipp_set):
    HANDLES.get(aipp_set, AIPP, "mdl.destroy_aipp", "an AIPP set (acl.mdl.create_aipp)")
    HANDLES.drop(aipp_set)


def _aipp_setter(name: str):
    call = f"mdl.{name}"

    @code(call)
    def setter(aipp_set, *params):
        a = HANDLES.get(aipp_set, AIPP, call, "an AIPP set (acl.mdl.create_aipp)")
        for i, p in enumerate(params):
            if isinstance(p, bool) or not isinstance(p, (int, float)):
                raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: parameter {i + 1} {args.shown(p)} is not a number")
        a.params[name] = params
    setter.__name__ = name
    setter.__doc__ = f"``ret = acl.{call}(aipp_set, ...)``: recorded on the AIPP set (npusim models take no AIPP)."
    return setter


set_aipp_input_format = _aipp_setter("set_aipp_input_format")
set_aipp_csc_params = _aipp_setter("set_aipp_csc_params")
set_aipp_rbuv_swap_switch = _aipp_setter("set_aipp_rbuv_swap_switch")
set_aipp_ax_swap_switch = _aipp_setter("set_aipp_ax_swap_switch")
set_aipp_src_image_size = _aipp_setter("set_aipp_src_image_size")
set_aipp_scf_params = _aipp_setter("set_aipp_scf_params")
set_aipp_crop_params = _aipp_setter("set_aipp_crop_params")
set_aipp_padding_params = _aipp_setter("set_aipp_padding_params")
set_aipp_dtc_pixel_mean_chn = _aipp_setter("set_aipp_dtc_pixel_mean_chn")
set_aipp_dtc_pixel_min_chn = _aipp_setter("set_aipp_dtc_pixel_min_chn")
set_aipp_pixel_var_reci_chn = _aipp_setter("set_aipp_pixel_var_reci_chn")


def _no_aipp(call: str, model_id, index) -> dict:
    desc = mdl.get_desc(model_id)
    if not args.is_int(index) or not 0 <= index < len(desc.inputs):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: index {args.shown(index)} out of range, the model has "
                                                  f"{len(desc.inputs)} inputs")
    return desc.inputs[int(index)]


@values("mdl.get_aipp_type", ACL_DATA_WITHOUT_AIPP, ACL_INVALID_NODE_INDEX)
def get_aipp_type(model_id, index):
    """``(type, dynamic_attached_index, ret)``: every npusim input is ACL_DATA_WITHOUT_AIPP."""
    _no_aipp("mdl.get_aipp_type", model_id, index)
    return ACL_DATA_WITHOUT_AIPP, ACL_INVALID_NODE_INDEX


@code("mdl.set_input_aipp")
def set_input_aipp(model_id, dataset, index, aipp_set):
    call = "mdl.set_input_aipp"
    _dataset(dataset, call)
    HANDLES.get(aipp_set, AIPP, call, "an AIPP set (acl.mdl.create_aipp)")
    _no_aipp(call, model_id, index)
    raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: [Check][AippData]Dynamic AIPP data index {index} is invalid: "
                                              f"the model is not a dynamic aipp model, there is no dynamic aipp node")


@code("mdl.set_aipp_by_input_index")
def set_aipp_by_input_index(model_id, dataset, index, aipp_set):
    call = "mdl.set_aipp_by_input_index"
    _dataset(dataset, call)
    HANDLES.get(aipp_set, AIPP, call, "an AIPP set (acl.mdl.create_aipp)")
    _no_aipp(call, model_id, index)
    raise AclError(E.ACL_ERROR_FAILURE, f"{call}: [Check][Type]This {index} input has no dynamic aipp linked, "
                                        f"modelId[{model_id}]")


@values("mdl.get_first_aipp_info", {})
def get_first_aipp_info(model_id, index):
    _no_aipp("mdl.get_first_aipp_info", model_id, index)
    raise AclError(ACL_ERROR_GE_AIPP_NOT_EXIST, f"mdl.get_first_aipp_info: the tensor index[{index}] is not "
                                                f"configured with aipp, modelId[{model_id}]")


__all__ = ["create_aipp", "destroy_aipp", "get_aipp_type", "get_dynamic_hw", "get_first_aipp_info",
           "get_input_dims_v2", "get_input_dynamic_dims", "get_input_dynamic_gear_count", "get_op_attr", "load_from_file_with_mem", "load_from_mem_with_mem", "query_size",
           "query_size_from_mem", "set_aipp_ax_swap_switch", "set_aipp_by_input_index", "set_aipp_crop_params",
           "set_aipp_csc_params", "set_aipp_dtc_pixel_mean_chn", "set_aipp_dtc_pixel_min_chn",
           "set_aipp_input_format", "set_aipp_padding_params", "set_aipp_pixel_var_reci_chn",
           "set_aipp_rbuv_swap_switch", "set_aipp_scf_params", "set_aipp_src_image_size", "set_dynamic_hw_size",
           "set_input_aipp"]
