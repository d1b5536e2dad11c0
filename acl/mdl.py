"""``acl.mdl`` (npusim: ``rt/acl/mdlapi.py``)."""

from rt.acl.mdlapi import *  # noqa: F401,F403
from rt.acl.mdlapi import __all__  # noqa: F401
