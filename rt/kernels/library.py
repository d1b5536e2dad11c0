"""The built-in op library: importing this module registers every built-in op (once), each op module
adding its ``OpDef``s to ``opdef.py``'s table; ``registry.py`` imports it and looks them up."""

from __future__ import annotations

from . import (activations, conv, conv_transpose, elementwise, indices, layout, nn, optim,  # noqa: F401
               pool, reduce, reduce_more, resize, shape_ops, training)
