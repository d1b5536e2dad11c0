"""Built-in kernel library (ONNX-named ops over numpy views of card memory)."""

from .registry import BY_SNAKE, REGISTRY, OpDef, TensorSpec, get_op, infer, register

__all__ = ["BY_SNAKE", "REGISTRY", "OpDef", "TensorSpec", "get_op", "infer", "register"]
