"""Model descriptions (``get_desc``) and their pyACL getters: inputs and outputs, sizes, dims, dtypes."""

from __future__ import annotations

import numpy as np

from .. import args
from ..constants import AclErrorCode, Format
from ..errors import AclError

INVALID = AclErrorCode.ACL_ERROR_INVALID_PARAM


class ModelDesc:
    """What ``get_desc`` returns: the model's inputs/outputs and the dims of its latest execution."""

    def __init__(self, model_id: int, desc: dict):
        self.model_id = model_id
        self.name = desc["name"]
        self.inputs = desc["inputs"]
        self.outputs = desc["outputs"]
        self.batch_sizes = list(desc.get("batch_sizes", []))
        self.cur_output_dims = [list(o.get("max_dims", o["dims"])) for o in self.outputs]   # CANN: the largest gear

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
        raise AclError(INVALID, f"{what}: index {args.shown(i)} out of range, model {desc.name!r} has {len(items)} {which}s")
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
    """``{"name", "dimCount", "dims"}`` of output ``i``: for a model with gears its dims at the largest gear (as
    CANN's aclmdlGetOutputDims), else as declared (dynamic dims -1)."""
    item = _io(desc, i, "output", "get_output_dims")
    return _dims(item, item.get("max_dims", item["dims"]))


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
    raise AclError(INVALID, f"get_input_index_by_name: model {desc.name!r} has no input {args.shown(name)} "
                            f"(inputs: {[x['name'] for x in desc.inputs]})")


def get_output_index_by_name(desc: ModelDesc, name: str) -> int:
    args.text(name, "get_output_index_by_name", "name")
    for i, item in enumerate(_desc(desc, "get_output_index_by_name").outputs):
        if item["name"] == name:
            return i
    raise AclError(INVALID, f"get_output_index_by_name: model {desc.name!r} has no output {args.shown(name)} "
                            f"(outputs: {[x['name'] for x in desc.outputs]})")




__all__ = ["ModelDesc", "get_cur_output_dims", "get_input_data_type", "get_input_dims", "get_input_format", "get_input_index_by_name", "get_input_name_by_index", "get_input_size_by_index", "get_num_inputs", "get_num_outputs", "get_output_data_type", "get_output_dims", "get_output_format", "get_output_index_by_name", "get_output_name_by_index", "get_output_size_by_index"]
