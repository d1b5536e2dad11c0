"""The pyACL facade: ``import acl`` runs a pyACL program on simulated cards. It is written on ``rt``'s public API
and lives above it: nothing in ``rt`` imports it. A real pyACL earlier on ``sys.path`` (CANN's ``set_env.sh`` puts
it on ``PYTHONPATH``) is found first and wins.

pyACL's module layout and conventions (``docs/pyacl.md``): ``acl.init/finalize/get_soc_name/
get_recent_err_msg`` and the data-buffer functions at the root, ``acl.rt``, ``acl.mdl``, ``acl.util``,
``acl.media``; return codes and ``(value, ret)`` tuples instead of exceptions, int handles, host memory as
int addresses. Importing it starts nothing (Ray's own NPU detection imports it while Ray starts).
"""

from . import mdl, media, rt, util
from ._base import (data_type_size, finalize, float16_to_float, float_to_float16, get_recent_err_msg, get_soc_name,
                   get_version, init)
from ._mdl import (create_data_buffer, destroy_data_buffer, get_data_buffer_addr, get_data_buffer_size,
                   get_data_buffer_size_v2, update_data_buffer)
