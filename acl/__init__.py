"""pyACL's name for npusim's pyACL facade (``rt/acl/``): an existing pyACL program runs unchanged on simulated
cards. A real pyACL earlier on ``sys.path`` (CANN's ``set_env.sh`` puts it on ``PYTHONPATH``) is found first
and wins. See docs/pyacl.md."""

from rt.acl import (create_data_buffer, data_type_size, destroy_data_buffer, finalize, float16_to_float,
                    float_to_float16, get_data_buffer_addr, get_data_buffer_size, get_data_buffer_size_v2,
                    get_recent_err_msg, get_soc_name, get_version, init, update_data_buffer)

from . import mdl, media, rt, util
