"""The pyACL facade: ``import acl`` (or ``import rt.acl as acl``) runs a pyACL program on simulated cards.

pyACL's module layout and conventions (``docs/pyacl.md``): ``acl.init/finalize/get_soc_name/
get_recent_err_msg`` and the data-buffer functions at the root, ``acl.rt``, ``acl.mdl``, ``acl.util``,
``acl.media``; return codes and ``(value, ret)`` tuples instead of exceptions, int handles, host memory as
int addresses. Importing it starts nothing (Ray's own NPU detection imports it while Ray starts).
"""

from . import media, util
from . import mdlapi as mdl
from . import rtapi as rt
from .base import (data_type_size, finalize, float16_to_float, float_to_float16, get_recent_err_msg, get_soc_name,
                   get_version, init)
from .mdlapi import (create_data_buffer, destroy_data_buffer, get_data_buffer_addr, get_data_buffer_size,
                     get_data_buffer_size_v2, update_data_buffer)
