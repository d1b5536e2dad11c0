"""``acl.util``: pointer helpers and threads — pyACL's names only (the implementation, with its helpers, is ``acl/_util.py``)."""

from ._util import *
from ._util import __all__  # noqa: F401
