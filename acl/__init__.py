"""The pyACL facade: ``import acl`` runs a pyACL program on simulated cards. It is written on ``rt``'s public API
and lives above it: nothing in ``rt`` imports it. A real pyACL earlier on ``sys.path`` (CANN's ``set_env.sh`` puts
it on ``PYTHONPATH``) is found first and wins.

pyACL's module layout and conventions (``docs/pyacl.md``): ``acl.init/finalize/get_soc_name/
get_recent_err_msg/app_log``, the data-buffer and tensor-desc functions at the root, ``acl.rt``, ``acl.mdl``,
``acl.op``, ``acl.util``, ``acl.media``; return codes and ``(value, ret)`` tuples instead of exceptions, int
handles, host memory as int addresses. Importing it starts nothing (Ray's own NPU detection imports it while
Ray starts).
"""

from . import mdl, media, op, rt, util
from ._base import (
                    ACL_DEBUG,
                    ACL_ERROR,
                    ACL_INFO,
                    ACL_WARNING,
                    app_log,
                    data_type_size,
                    finalize,
                    float16_to_float,
                    float_to_float16,
                    get_recent_err_msg,
                    get_soc_name,
                    get_version,
                    init,
)
from ._mdl import (
                    create_data_buffer,
                    destroy_data_buffer,
                    get_data_buffer_addr,
                    get_data_buffer_size,
                    get_data_buffer_size_v2,
                    update_data_buffer,
)
from ._tensor import (
                    create_tensor_desc,
                    destroy_tensor_desc,
                    get_tensor_desc_dim,
                    get_tensor_desc_dim_v2,
                    get_tensor_desc_element_count,
                    get_tensor_desc_format,
                    get_tensor_desc_name,
                    get_tensor_desc_num_dims,
                    get_tensor_desc_size,
                    get_tensor_desc_type,
                    set_tensor_desc_name,
                    set_tensor_format,
                    set_tensor_place_ment,
                    set_tensor_shape,
                    set_tensor_storage_format,
                    set_tensor_storage_shape,
)
