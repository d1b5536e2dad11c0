"""``acl.mdl``: offline models and datasets — pyACL's names only (the implementation, with its helpers, is ``acl/_mdl.py``)."""

from ._mdl import *  # noqa: F401,F403
from ._mdl import __all__  # noqa: F401
