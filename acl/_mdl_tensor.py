"""``acl.mdl.set_dataset_tensor_desc`` / ``get_dataset_tensor_desc``: the shapes of a dynamic-shape model's
inputs and outputs, CANN's way for a model whose inputs have -1 dims and no gears (``atc --input_shape`` with
-1 and no gear option).

Before an execution the program gives each dynamic input a tensor desc of its real dims (only the dims count,
as in CANN; the data type and format are ignored); the execution checks them against the model (100017 when
they do not fit its declared shape). After it, ``get_dataset_tensor_desc(output_dataset, i)`` is a desc of
output ``i``'s dims. The dataset owns these descs: they go with ``destroy_dataset`` (``acl/_tensor.py``).
"""

from __future__ import annotations

from rt import args
from rt.constants import AclErrorCode as E
from rt.errors import AclError

from ._core import HANDLES, plain, values
from ._mdl import _dataset
from ._tensor import DATASET_DESCS, TENSOR_DESC, TensorDesc, desc_of, own_desc

ACL_FORMAT_ND = 2


@values("mdl.set_dataset_tensor_desc", 0)
def set_dataset_tensor_desc(dataset, tensor_desc, index):
    """``(dataset, ret)``: input or output ``index`` of ``dataset`` takes the dims of ``tensor_desc``."""
    call = "mdl.set_dataset_tensor_desc"
    ds = _dataset(dataset, call)
    d = desc_of(tensor_desc, call)
    if not args.is_int(index) or not 0 <= index < len(ds.buffers):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: index {args.shown(index)} out of range, the dataset has "
                                                  f"{len(ds.buffers)} buffers")
    if not d.static:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: tensor desc dims {d.dims} must be the real dims of the "
                                                  f"data (no -1 or -2)")
    ds.dims[int(index)] = list(d.dims)          # rt checks them against the model when it executes
    own_desc(dataset, int(index), TensorDesc(d.acl_dtype, list(d.dims), d.format))
    return dataset


@plain("mdl.get_dataset_tensor_desc", 0)
def get_dataset_tensor_desc(dataset, index):
    """The desc of ``dataset``'s input or output ``index``: what set_dataset_tensor_desc gave it, or for an
    output dataset the output's dims of the latest execution; 0 when it has none."""
    call = "mdl.get_dataset_tensor_desc"
    _dataset(dataset, call)
    h = DATASET_DESCS.get(dataset, {}).get(index) if args.is_int(index) else None
    if h is None:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: the dataset has no tensor desc at index "
                                                  f"{args.shown(index)} (set_dataset_tensor_desc, or an execution "
                                                  f"that filled this output dataset)")
    HANDLES.get(h, TENSOR_DESC, call, "a tensor desc")
    return h


def record_outputs(output, out_dims: list[list[int]], items: list[dict]) -> None:
    """After an execution: the output dataset owns a desc of each output's dims (ND, the output's dtype)."""
    for i, (dims, item) in enumerate(zip(out_dims, items)):
        own_desc(output, i, TensorDesc(int(item["acl_dtype"]), list(dims), ACL_FORMAT_ND))


__all__ = ["get_dataset_tensor_desc", "set_dataset_tensor_desc"]
