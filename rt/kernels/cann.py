"""CANN operator types and attributes, as single-op programs name them, turned into the card's ONNX-named kernels.

``atc --singleop`` (``rt/mdl/onnx/singleop.py``) and ``acl.op`` (``acl/_op.py``) both go through :func:`to_kernel`,
so an op list compiled by ATC and the ``execute_v2`` call that runs it agree on what the operator is. An op type
the table does not name is a kernel of that name (``Add``, ``Relu``, ``Softmax``, ...), its attributes unchanged.

CANN's spellings mapped (from its operator prototypes):

- ``RealDiv`` -> ``Div``; ``Maximum`` / ``Minimum`` -> ``Max`` / ``Min``;
- ``Cast(dst_type, truncate)`` -> ``Cast(to)``: ``dst_type`` is an aclDataType number, which the card's Cast reads
  as such; ``truncate`` (float to integer rounds toward zero either way) is dropped;
- ``SoftmaxV2(axes)`` / ``LogSoftmaxV2(axes)`` -> ``Softmax(axis)`` / ``LogSoftmax(axis)``: one axis (default
  ``[-1]``);
- ``MatMul`` / ``MatMulV2(transpose_x1, transpose_x2, offset_x)`` with an optional bias -> ``MatMul``, or ``Gemm``
  (2-D, ``transA`` / ``transB``, the bias as ``C``) when an operand is transposed or a bias is given;
  ``BatchMatMul`` / ``BatchMatMulV2(adj_x1, adj_x2)`` -> ``MatMul``, untransposed only.

A value the kernel cannot express is refused with ACL_ERROR_OP_ATTR_NOT_MATCH (100023) naming the attribute.
"""

from __future__ import annotations

from ..constants import AclErrorCode as E
from ..errors import AclError

RENAMED = {"RealDiv": "Div", "Maximum": "Max", "Minimum": "Min", "SoftmaxV2": "Softmax", "LogSoftmaxV2": "LogSoftmax",
           "BatchMatMul": "MatMul", "BatchMatMulV2": "MatMul", "MatMulV2": "MatMul"}


def _refuse(op: str, name: str, value, why: str) -> AclError:
    return AclError(E.ACL_ERROR_OP_ATTR_NOT_MATCH, f"{op}: attribute {name}={value!r} {why}")


def _flag(op: str, attrs: dict, name: str) -> bool:
    value = attrs.pop(name, False)
    if not isinstance(value, (bool, int)):
        raise _refuse(op, name, value, "is not a bool")
    return bool(value)


def _cast(op: str, attrs: dict, n_inputs: int) -> tuple[str, dict]:
    if "dst_type" in attrs:
        attrs["to"] = attrs.pop("dst_type")
    _flag(op, attrs, "truncate")
    return "Cast", attrs


def _softmax(op: str, attrs: dict, n_inputs: int) -> tuple[str, dict]:
    axes = attrs.pop("axes", [-1])
    if isinstance(axes, int) and not isinstance(axes, bool):
        axes = [axes]
    if not isinstance(axes, (list, tuple)) or len(axes) != 1 or isinstance(axes[0], bool) \
            or not isinstance(axes[0], int):
        raise _refuse(op, "axes", axes, "must name exactly one axis on a simulated card")
    attrs["axis"] = int(axes[0])
    return RENAMED[op], attrs


def _matmul(op: str, attrs: dict, n_inputs: int) -> tuple[str, dict]:
    first, second = ("adj_x1", "adj_x2") if op.startswith("Batch") else ("transpose_x1", "transpose_x2")
    trans_a, trans_b = _flag(op, attrs, first), _flag(op, attrs, second)
    offset = attrs.pop("offset_x", 0)
    if offset != 0:
        raise _refuse(op, "offset_x", offset, "is for quantized inputs; only 0 is supported")
    if op.startswith("Batch"):
        if trans_a or trans_b:
            raise _refuse(op, first if trans_a else second, True, "(a transposed batch operand) is not supported on "
                          "a simulated card; transpose it first (Transpose)")
        return "MatMul", attrs
    if trans_a or trans_b or n_inputs == 3:
        attrs.update(transA=int(trans_a), transB=int(trans_b))
        return "Gemm", attrs
    return "MatMul", attrs


SPECIAL = {"Cast": _cast, "SoftmaxV2": _softmax, "LogSoftmaxV2": _softmax, "MatMul": _matmul, "MatMulV2": _matmul,
           "BatchMatMul": _matmul, "BatchMatMulV2": _matmul}


def to_kernel(op: str, attrs: dict, n_inputs: int) -> tuple[str, dict]:
    """(kernel name, its attributes) for CANN operator ``op`` called with ``attrs`` and ``n_inputs`` inputs (a new
    dict; ``attrs`` is not changed)."""
    attrs = dict(attrs)
    special = SPECIAL.get(op)
    if special is not None:
        return special(op, attrs, n_inputs)
    return RENAMED.get(op, op), attrs
