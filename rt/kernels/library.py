"""The built-in op library: importing this module registers every built-in op (once).

``registry.get_op`` imports it lazily, so a card or a model builder pays for the op modules only
when it first looks an op up.
"""

from __future__ import annotations

from . import elementwise, nn, optim, reduce, shape_ops, training  # noqa: F401  (register on import)
