"""``acl.rt``: devices, contexts, streams, events, memory, copies, callbacks — pyACL's names only (the implementation, with its helpers, is ``acl/_rt.py``)."""

from ._rt import *
from ._rt import __all__  # noqa: F401
