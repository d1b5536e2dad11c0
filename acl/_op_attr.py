"""``aclopAttr`` as pyACL has it: ``acl.op.create_attr()``, the ``set_attr_*`` setters, ``destroy_attr``.

An attr is an int handle holding ``name -> value``; the values are what the operator's kernel takes as its
attributes (bool, int, float, str, lists of them, a list of int lists, a data type — an aclDataType code, kept
as the numpy dtype name npusim's kernels and op models spell it). Each setter checks its value's type as
pyACL's binding parses it (``set_attr_int(attr, "axis", 1.5)`` is 100000, not a silently truncated 1) and a
value a 64-bit C parameter cannot hold is refused the same way.
"""

from __future__ import annotations

import math

import numpy as np

from rt import args
from rt.constants import AclErrorCode as E
from rt.constants import DataType
from rt.dtypes import ACL_TO_NP
from rt.errors import AclError

from ._core import HANDLES, code, plain

OP_ATTR = "op attr"
INT64_LO, INT64_HI = -(1 << 63), (1 << 63) - 1


class OpAttr:
    """What ``create_attr`` makes: attribute name -> value, in the order set."""

    def __init__(self):
        self.values: dict[str, object] = {}

    def describe(self) -> str:
        return "{" + ", ".join(f"{k}={v!r}" for k, v in self.values.items()) + "}"


def attr_of(h, call: str) -> OpAttr:
    return HANDLES.get(h, OP_ATTR, call, "an op attr (acl.op.create_attr)")


def _invalid(call: str, text: str) -> AclError:
    return AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {text}")


def _bool(v, call):
    if isinstance(v, (bool, np.bool_)) or args.is_int(v) and 0 <= v <= 255:   # C uint8_t, as pyACL passes it
        return bool(v)
    raise _invalid(call, f"{args.shown(v)} is not a bool (or an int 0..255)")


def _int(v, call):
    if args.is_int(v) and INT64_LO <= v <= INT64_HI:
        return int(v)
    raise _invalid(call, f"{args.shown(v)} is not an int64")


def _float(v, call):
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)):
        return float(np.float32(v)) if math.isfinite(v) else float(v)    # C float: rounded to float32
    raise _invalid(call, f"{args.shown(v)} is not a number")


def _str(v, call):
    if isinstance(v, str):
        return v
    raise _invalid(call, f"{args.shown(v)} is not a str")


def _data_type(v, call):
    """An aclDataType code, kept as the dtype's name: what the kernels and npusim's op models spell."""
    if args.is_int(v) and int(v) in DataType._value2member_map_ and DataType(int(v)) in ACL_TO_NP:
        return ACL_TO_NP[DataType(int(v))].name
    raise _invalid(call, f"{args.shown(v)} is not an aclDataType code npusim has (codes: "
                         f"{sorted(int(d) for d in ACL_TO_NP)})")


def _list(one):
    def parse(v, call):
        if isinstance(v, np.ndarray) and v.ndim == 1:
            v = v.tolist()
        if not isinstance(v, (list, tuple)):
            raise _invalid(call, f"{args.shown(v)} is not a list")
        return [one(x, call) for x in v]
    return parse


def _setter(call: str, parse, what: str):
    @code(call)
    def set_attr(attr, attr_name, attr_value):
        a = attr_of(attr, call)
        name = args.text(attr_name, call, "attr_name")
        if not name:
            raise _invalid(call, "attr_name is empty")
        a.values[name] = parse(attr_value, call)
    set_attr.__name__ = call.split(".")[-1]
    set_attr.__doc__ = f"``ret = acl.{call}(attr, attr_name, attr_value)``: set an attribute to {what}."
    return set_attr


set_attr_bool = _setter("op.set_attr_bool", _bool, "a bool (pyACL passes 0/1)")
set_attr_int = _setter("op.set_attr_int", _int, "an int64")
set_attr_float = _setter("op.set_attr_float", _float, "a float (C float)")
set_attr_string = _setter("op.set_attr_string", _str, "a str")
set_attr_data_type = _setter("op.set_attr_data_type", _data_type, "an aclDataType code")
set_attr_list_bool = _setter("op.set_attr_list_bool", _list(_bool), "a list of bools")
set_attr_list_int = _setter("op.set_attr_list_int", _list(_int), "a list (or 1-D int64 ndarray) of int64s")
set_attr_list_float = _setter("op.set_attr_list_float", _list(_float), "a list of floats")
set_attr_list_string = _setter("op.set_attr_list_string", _list(_str), "a list of strs")
set_attr_list_data_type = _setter("op.set_attr_list_data_type", _list(_data_type), "a list of aclDataType codes")
set_attr_list_list_int = _setter("op.set_attr_list_list_int", _list(_list(_int)), "a list of int64 lists")


@plain("op.create_attr", 0)
def create_attr():
    return HANDLES.add(OP_ATTR, OpAttr())


@plain("op.destroy_attr", None)
def destroy_attr(attr):
    """Nothing is returned (aclopDestroyAttr is void); a bad handle is recorded for get_recent_err_msg."""
    attr_of(attr, "op.destroy_attr")
    HANDLES.drop(attr)
