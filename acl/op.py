"""``acl.op``: single-operator execution — pyACL's names only (``acl/_op.py``, attributes in ``acl/_op_attr.py``)."""

from ._op import (
                  compile,
                  compile_and_execute,
                  compile_and_execute_v2,
                  create_handle,
                  destroy_handle,
                  execute,
                  execute_v2,
                  execute_with_handle,
                  load,
                  set_model_dir,
)
from ._op_attr import (
                  create_attr,
                  destroy_attr,
                  set_attr_bool,
                  set_attr_data_type,
                  set_attr_float,
                  set_attr_int,
                  set_attr_list_bool,
                  set_attr_list_data_type,
                  set_attr_list_float,
                  set_attr_list_int,
                  set_attr_list_list_int,
                  set_attr_list_string,
                  set_attr_string,
)

__all__ = ["compile", "compile_and_execute", "compile_and_execute_v2", "create_attr", "create_handle", "destroy_attr",
           "destroy_handle", "execute", "execute_v2", "execute_with_handle", "load", "set_attr_bool", "set_attr_data_type", "set_attr_float", "set_attr_int",
           "set_attr_list_bool", "set_attr_list_data_type", "set_attr_list_float", "set_attr_list_int",
           "set_attr_list_list_int", "set_attr_list_string", "set_attr_string", "set_model_dir"]
