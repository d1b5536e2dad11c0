"""Eager built-in ops on the current card: ``rt.ops.matmul(a, b)``, ... (see ``rt/host/ops.py``)."""

from .host.ops import *  # noqa: F401,F403
from .host.ops import __all__  # noqa: F401
