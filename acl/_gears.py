"""A loaded model's gears as CANN's model description reports them: dynamic batch, image size (``atc
--dynamic_image_size``) or dims (``--dynamic_dims``).

CANN gives every gear model the virtual input ``ascend_mbatch_shape_data`` after its real ones (int64: one
value for a batch, two for an image size, one per dynamic dim) and reports a dynamic input's or output's size
as its largest gear's, so a program can ``malloc`` it once (the card's desc reports that size,
``rt/card/models.py``). The gears come from the model definition rt keeps on the host, weights stripped.
"""

from __future__ import annotations

from rt.constants import DataType
from rt.errors import AclError
from rt.mdl import api as mdl_api
from rt.mdl.shapes import gear_shapes as profile_shapes

MBATCH = "ascend_mbatch_shape_data"          # CANN's virtual input of a gear model


def model_def(model_id, call: str):
    """The loaded model's definition without its weight bytes (rt's host-side copy)."""
    try:
        return mdl_api.get_model_def(model_id)          # rt keeps it host-side for exactly such questions
    except AclError as e:
        raise AclError(e.code, f"{call}: model id {model_id!r} is not loaded in this process") from None


def kind(model) -> str | None:
    """"batch", "hw", "dims" or None."""
    if model.batch_sizes:
        return "batch"
    if getattr(model, "image_sizes", ()):
        return "hw"
    if getattr(model, "dims", ()):
        return "dims"
    return None


def virtual_input(model) -> dict | None:
    """The desc entry of ``ascend_mbatch_shape_data`` for a gear model, else None."""
    k = kind(model)
    if k is None:
        return None
    n = {"batch": 1, "hw": 2}.get(k) or sum(v.shape.count(-1) for v in model.inputs)
    return {"name": MBATCH, "dims": [n], "acl_dtype": int(DataType.ACL_INT64), "size": 8 * n}


def hw_gears(model) -> list[list[int]]:
    return [list(p) for p in getattr(model, "image_sizes", ())]


def dims_gears(model) -> list[tuple[int, ...]]:
    return list(getattr(model, "dims", ()))


__all__ = ["MBATCH", "dims_gears", "hw_gears", "kind", "model_def", "profile_shapes",
           "virtual_input"]
