"""``acl.util`` (npusim: ``rt/acl/util.py``)."""

from rt.acl.util import *  # noqa: F401,F403
from rt.acl.util import __all__  # noqa: F401
