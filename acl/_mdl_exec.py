"""``acl.mdl.execute`` / ``execute_async`` / ``unload`` as CANN behaves.

Input buffers, as CANN's model executor takes them (``DavinciModel::CopyPlainData``): a buffer *larger* than
the model's input is refused (ACL_ERROR_GE_PARAM_INVALID, 145000, "input data size(...) is bigger than model
required size(...)"); a *smaller* one is accepted and its bytes are copied to the start of the input — acllite
only warns when a text input is short. CANN leaves the rest of the input memory as it was; npusim fills it
with zeros (deterministic), in stream order, in a scratch buffer freed once the execution is done. The
buffer of a gear model's virtual input (``ascend_mbatch_shape_data``) is stripped before rt runs the model.

``unload`` after ``acl.finalize`` returns ACL_ERROR_UNINITIALIZE (100001), and after the model's card was
reset ACL_ERROR_INVALID_MODEL_ID (100011): the release of a resource that went with its device is a code,
never a crash or a hang, in whatever order a program's ``__del__`` methods run.
"""

from __future__ import annotations

import rt
from rt import mdl
from rt.constants import AclErrorCode as E
from rt.errors import AclError, NpuError
from rt.host.runtime import RUNTIME

from . import _gears as gears
from ._core import code, stream_of
from ._mdl import _dataset
from ._mdl_tensor import record_outputs

ACL_ERROR_GE_PARAM_INVALID = 145000


def _prepared_inputs(model_id, ds, call: str, stream):
    """(the dataset rt runs, scratch tensors to free after it): the virtual input's buffer dropped, short
    buffers of static inputs padded with zeros on ``stream``, larger ones refused."""
    desc = mdl.get_desc(model_id)
    n = len(desc.inputs)
    model = gears.model_def(model_id, call)
    geared = gears.kind(model) is not None
    buffers = ds.buffers[:n] if geared and len(ds.buffers) == n + 1 else list(ds.buffers)
    scratch = []
    for i, (buf, item) in enumerate(zip(buffers, desc.inputs)):
        declared = item["size"]
        if declared and buf.size > declared:
            raise AclError(ACL_ERROR_GE_PARAM_INVALID, f"{call}: [Check][Param] input data size({buf.size}) is bigger "
                                                       f"than model required size({declared}), op_name({item['name']})")
        if -1 in item["dims"] or geared or buf.size >= declared:
            continue
        pad = rt.empty((declared,), "uint8")
        scratch.append(pad)
        rt.memset_async(pad.ptr, declared, 0, declared, stream)
        if buf.size:
            rt.memcpy_async(pad.ptr, declared, buf.ptr, buf.size, rt.ACL_MEMCPY_DEVICE_TO_DEVICE, stream)
        buffers[i] = mdl.create_data_buffer(pad.ptr, declared)
    if buffers == ds.buffers:
        return ds, scratch
    real = mdl.create_dataset()
    real.buffers = buffers
    real.batch, real.dims = ds.batch, ds.dims
    return real, scratch


def _system_outputs(model_id, real, output) -> None:
    """Outputs "allocated by the system" (CANN's first way for a dynamic-shape output, whose size the desc gives as
    0): an output buffer created with ``create_data_buffer(0, 0)`` gets device memory of what this execution
    writes there. The program reads it (``get_data_buffer_addr`` / ``get_data_buffer_size_v2``) and frees it
    with ``acl.rt.free``, as on CANN."""
    empty = [i for i, buf in enumerate(output.buffers) if buf.ptr == 0 and buf.size == 0]
    if not empty:
        return
    shapes = mdl.output_shapes(model_id, real)
    if len(shapes) != len(output.buffers):
        return                                  # execute refuses the dataset, naming the counts
    for i in empty:
        shape, dtype = shapes[i]
        need = dtype.itemsize
        for d in shape:
            need *= d
        output.buffers[i].ptr, output.buffers[i].size = rt.malloc(max(need, 1)), need


def _free_after(scratch, stream) -> None:
    """Free the scratch buffers once the stream has run the execution (a callback: freed in stream order)."""
    if scratch:
        rt.launch_callback(lambda tensors: [t.free() for t in tensors], scratch, True, stream)


def _record(model_id, output) -> None:
    """The output dataset's descs (get_dataset_tensor_desc): the dims rt computed for this execution."""
    desc = mdl.get_desc(model_id)
    record_outputs(output, desc.cur_output_dims, desc.outputs)


@code("mdl.execute")
def execute(model_id, input, output):
    ds = _dataset(input, "mdl.execute")
    real, scratch = _prepared_inputs(model_id, ds, "mdl.execute", None)
    out = _dataset(output, "mdl.execute")
    _system_outputs(model_id, real, out)
    try:
        mdl.execute(model_id, real, out)
    finally:
        _free_after(scratch, None)
    _record(model_id, output)


@code("mdl.execute_async")
def execute_async(model_id, input, output, stream):
    ds = _dataset(input, "mdl.execute_async")
    st = stream_of(stream, "mdl.execute_async")
    real, scratch = _prepared_inputs(model_id, ds, "mdl.execute_async", st)
    out = _dataset(output, "mdl.execute_async")
    _system_outputs(model_id, real, out)
    try:
        mdl.execute_async(model_id, real, out, st)
    finally:
        _free_after(scratch, st)
    _record(model_id, output)


@code("mdl.unload")
def unload(model_id):
    if not RUNTIME.initialized:
        raise AclError(E.ACL_ERROR_UNINITIALIZE, f"mdl.unload: model {model_id}: acl is not initialized "
                                                 f"(acl.finalize released every model of the process)")
    try:
        mdl.unload(model_id)
    except NpuError as e:
        if e.code != E.ACL_ERROR_RT_SOCKET_CLOSE:
            raise
        raise AclError(E.ACL_ERROR_INVALID_MODEL_ID, f"mdl.unload: model {model_id} went with its device "
                                                     f"(acl.rt.reset_device released the card's resources)") from None


__all__ = ["execute", "execute_async", "unload"]
