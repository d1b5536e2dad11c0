"""``acl.rt`` (npusim: ``rt/acl/rtapi.py``)."""

from rt.acl.rtapi import *  # noqa: F401,F403
from rt.acl.rtapi import __all__  # noqa: F401
