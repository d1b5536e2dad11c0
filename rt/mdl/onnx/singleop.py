"""``atc --singleop=op_list.json``: one npusim model of exactly one node per op in ATC's JSON op list.

Each entry is ``{"op": type, "input_desc": [{"format", "shape", "type"[, "name"]}], "output_desc": [...],
"attr": [{"name", "type", "value"}]}``. The model's inputs and outputs are the op's, in the list's order; the
file is named as ATC names single-op models: ``<index>_<op>`` then, for every input and output desc,
``_<dtype code>_<format code>_<dims...>`` (ACL's aclDataType / aclFormat numbers), cut to 128 characters,
plus ``.om`` — e.g. ``0_Add_1_2_8_16_1_2_8_16_1_2_8_16.om`` for an fp16 ND [8,16] Add. ``acl.op.load`` /
``set_model_dir`` find them by op type, descs and attributes. CANN spellings whose card kernel is named
otherwise are mapped (``rt/kernels/cann.py``: ``RealDiv`` -> ``Div``, Cast's ``dst_type`` -> ``to``, MatMul's
``transpose_x1/x2`` -> Gemm, ...); the file name keeps the list's op type.

Dtype and format spellings are those of ATC's single-op parser (``float16``/``half``/``fp16``, ``float``/
``float32``, ...; formats case-insensitive). npusim keeps tensors in their origin layout, so only the origin
formats (ND, NCHW, NHWC, NCDHW, NDHWC, HWCN) are accepted; private formats (NC1HWC0, FRACTAL_Z, ...) are
refused with E10027.
"""

from __future__ import annotations

import json
import os

from ...errors import AclError
from ...kernels import cann
from ...kernels.registry import REGISTRY
from ..builder import GraphBuilder
from ..format import ModelDef, serialize
from .errors import AtcError

MAX_FILE_NAME = 128

# ATC single-op spelling -> (numpy dtype name, aclDataType code)
DTYPES = {"bool": ("bool", 12), "int8": ("int8", 2), "uint8": ("uint8", 4), "int16": ("int16", 6),
          "uint16": ("uint16", 7), "int32": ("int32", 3), "uint32": ("uint32", 8), "int64": ("int64", 9),
          "uint64": ("uint64", 10), "float16": ("float16", 1), "half": ("float16", 1), "fp16": ("float16", 1),
          "float": ("float32", 0), "float32": ("float32", 0), "double": ("float64", 11),
          "complex64": ("complex64", 16), "complex128": ("complex128", 17), "bfloat16": ("bfloat16", 27)}
# ATC format spelling -> aclFormat code (origin layouts only)
FORMATS = {"nchw": 0, "nhwc": 1, "nd": 2, "hwcn": 16, "ndhwc": 27, "ncdhw": 30}
# GE's serialized DataType names, accepted as "data_type" attribute values
DT_NAMES = {f"DT_{k.upper()}": v[0] for k, v in DTYPES.items() if k not in ("half", "fp16", "float32")}
ACL_CODES = {code: name for name, code in DTYPES.values()}

ATTR_TYPES = {"bool": bool, "int": int, "float": (int, float), "string": str, "list_bool": bool, "list_int": int,
              "list_float": (int, float), "list_string": str, "list_list_int": "list_list_int",
              "data_type": "data_type"}


def _bad_tensor(op: str, side: str, index: int, what: str) -> AtcError:
    return AtcError("E10027", f"Attribute [{what}] of [{side}] tensor [{index}] for Op [{op}] is invalid when "
                              f"--singleop is specified.")


def _desc(op: str, side: str, index: int, d) -> tuple[str, int, int, list[int], str | None]:
    if not isinstance(d, dict):
        raise _bad_tensor(op, side, index, "tensor")
    dtype, fmt, shape = d.get("type"), d.get("format"), d.get("shape")
    if not isinstance(dtype, str) or dtype.lower() not in DTYPES:
        raise _bad_tensor(op, side, index, "datatype")
    if not isinstance(fmt, str) or fmt.lower() not in FORMATS:
        raise _bad_tensor(op, side, index, "format")
    if not isinstance(shape, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= -1
                                              for x in shape):
        raise _bad_tensor(op, side, index, "shape")
    name = d.get("name") if isinstance(d.get("name"), str) and d.get("name") else None
    np_name, code = DTYPES[dtype.lower()]
    return np_name, code, FORMATS[fmt.lower()], shape, name


def _attr(op: str, a) -> tuple[str, object]:
    if not isinstance(a, dict) or not isinstance(a.get("name"), str) or not a["name"]:
        raise AtcError("E10029", f"Attribute name of Op [{op}] is empty in the file specified by --singleop.")
    name, kind, value = a["name"], a.get("type"), a.get("value")
    bad = AtcError("E10030", f"There is an invalid value for attribute name [{name}] of Op [{op}] in the file "
                             f"specified by --singleop.")
    want = ATTR_TYPES.get(kind)
    if want is None or value is None:
        raise bad
    if want == "data_type":  # "DT_FLOAT" or an aclDataType number
        if isinstance(value, str) and value in DT_NAMES:
            return name, DT_NAMES[value]
        if isinstance(value, int) and not isinstance(value, bool) and value in ACL_CODES:
            return name, ACL_CODES[value]
        raise bad
    if want == "list_list_int":
        ok = isinstance(value, list) and all(isinstance(r, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                                                         for x in r) for r in value)
    elif kind.startswith("list_"):
        ok = isinstance(value, list) and all(isinstance(x, want) and (want is bool or not isinstance(x, bool))
                                             for x in value)
    else:
        ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
    if not ok:
        raise bad
    return name, value


def file_name(index: int, op: str, descs) -> str:
    """ATC's single-op model file name for op ``index`` of the list."""
    parts = [str(index), op]
    for _, code, fmt, shape, _ in descs:
        parts += [str(code), str(fmt), *map(str, shape)]
    return "_".join(parts)[:MAX_FILE_NAME] + ".om"


def build_op(index: int, entry) -> tuple[str, ModelDef]:
    """(file name, one-node model) for one entry of the op list."""
    if not isinstance(entry, dict) or not isinstance(entry.get("op"), str) or not entry["op"]:
        raise AtcError("E10026", "The Op name is empty in the file specified by --singleop.")
    op = entry["op"]
    ins = [_desc(op, "input", i, d) for i, d in enumerate(entry.get("input_desc") or [])]
    outs = [_desc(op, "output", i, d) for i, d in enumerate(entry.get("output_desc") or [])]
    attrs = dict(_attr(op, a) for a in entry.get("attr") or [])
    try:
        kernel, attrs = cann.to_kernel(op, attrs, len(ins))
    except AclError as exc:
        raise AtcError("E10055", f"The operation is not supported. Reason: Op [{op}] (index {index}): "
                                 f"{exc.message}.") from None
    if kernel not in REGISTRY:
        raise AtcError("E10501", f"IR for Op [{op}] with optype [{op}] is not registered.")
    g = GraphBuilder(file_name(index, op, ins + outs)[:-3])
    xs = [g.input(name or f"x{i}", dtype, shape) for i, (dtype, _, _, shape, name) in enumerate(ins)]
    try:
        got = g.op(kernel, xs, outputs=[name or f"y{i}" for i, (_, _, _, _, name) in enumerate(outs)], name=op, **attrs)
    except AclError as exc:
        raise AtcError("E10055", f"The operation is not supported. Reason: Op [{op}] (index {index}): "
                                 f"{exc.message}.") from None
    got = got if isinstance(got, tuple) else (got,)
    for i, (v, (dtype, _, _, shape, _)) in enumerate(zip(got, outs)):
        if str(v.dtype) != dtype or list(v.shape) != list(shape):
            raise AtcError("E10055", f"The operation is not supported. Reason: Op [{op}] (index {index}): output_desc "
                                     f"[{i}] says {dtype}{shape} but the op computes {v.dtype}{list(v.shape)}.")
        g.output(v.name, v)
    return file_name(index, op, ins + outs), g.build()


def read_op_list(path: str) -> list:
    if not os.path.isfile(path):
        raise AtcError("E10023", f"Value [{path}] for parameter [--singleop] is invalid.")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        raise AtcError("E10024", f"Failed to open file [{path}] specified by --singleop.") from None
    try:
        ops = json.loads(text)
    except ValueError as exc:
        raise AtcError("E10025", f"File [{os.path.realpath(path)}] specified by --singleop is not a valid JSON "
                                 f"file. Reason: {exc}.") from None
    if not isinstance(ops, list):
        raise AtcError("E10025", f"File [{os.path.realpath(path)}] specified by --singleop is not a valid JSON "
                                 f"file. Reason: the op list must be a JSON array.")
    return ops


def generate(path: str, output_dir: str) -> list[str]:
    """Write one model per op of the list at ``path`` into ``output_dir`` (created); return the files written.
    Every op is checked before the first file is written."""
    models = [build_op(i, entry) for i, entry in enumerate(read_op_list(path))]
    try:
        os.makedirs(output_dir, exist_ok=True)
        written = []
        for name, model in models:
            target = os.path.join(output_dir, name)
            with open(target, "wb") as f:
                f.write(serialize(model))
            written.append(target)
    except OSError as exc:
        raise AtcError("E13004", f"Failed to write file [{output_dir}]. Reason: {exc.strerror or exc}.") from None
    return written

