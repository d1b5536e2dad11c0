"""The kernel registry: every built-in op by ONNX or snake_case name. Importing it imports the library
(``library.py``: every op module, each registering its ``OpDef``s into ``opdef.py``'s table)."""

from __future__ import annotations

from ..constants import AclErrorCode
from ..errors import AclError
from . import library  # noqa: F401  (registers the built-in ops)
from .opdef import BY_SNAKE, REGISTRY, OpDef, TensorSpec, register

__all__ = ["BY_SNAKE", "REGISTRY", "OpDef", "TensorSpec", "get_op", "infer", "register"]


def get_op(name: str) -> OpDef:
    """Look up by ONNX name or snake_case name; unknown names fail with ACL_ERROR_OP_NOT_FOUND."""
    op = REGISTRY.get(name) or BY_SNAKE.get(name)
    if op is None:
        raise AclError(AclErrorCode.ACL_ERROR_OP_NOT_FOUND,
                       f"unknown operator {name!r} (built-in ops: {', '.join(sorted(REGISTRY))})")
    return op


def infer(name: str, specs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    op = get_op(name)
    if not op.min_inputs <= len(specs) <= op.max_inputs:
        raise AclError(AclErrorCode.ACL_ERROR_OP_INPUT_NOT_MATCH,
                       f"{op.name}: got {len(specs)} inputs, expected {op.min_inputs}..{op.max_inputs}")
    return op.infer(list(specs), dict(attrs or {}))
