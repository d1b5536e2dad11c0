"""The built-in op library: importing this module registers every built-in op (once), each op module
adding its ``OpDef``s to ``opdef.py``'s table; ``registry.py`` imports it and looks them up."""

from __future__ import annotations

from . import elementwise, nn, optim, reduce, shape_ops, training  # noqa: F401  (register on import)
