"""``acl.media`` (npusim: ``rt/acl/media.py``)."""

from rt.acl.media import *  # noqa: F401,F403
from rt.acl.media import __all__  # noqa: F401
