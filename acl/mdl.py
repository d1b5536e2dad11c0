"""``acl.mdl``: offline models and datasets — pyACL's names only (the implementation, with its helpers, is
``acl/_mdl.py``, ``acl/_mdl_exec.py``, ``acl/_mdl_more.py`` and ``acl/_mdl_tensor.py``; each module's ``__all__`` lists what it gives
``acl.mdl``)."""

from ._mdl import *
from ._mdl_exec import *
from ._mdl_more import *
from ._mdl_tensor import *
