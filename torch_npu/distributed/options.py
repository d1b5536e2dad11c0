"""``ProcessGroupHCCL.Options``: torch_npu's ``pg_options`` for ``init_process_group("hccl", pg_options=...)`` and
``new_group(..., pg_options=...)`` (``torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options``).

The fields are torch_npu's (``torch_npu/csrc/distributed/Init.cpp``) on c10d's ``Backend.Options``:
``op_timeout``, ``is_high_priority_stream``, ``global_ranks_in_group``, ``hccl_config`` and ``group_id``, with
``backend`` and ``_timeout`` from c10d. c10d fills ``global_ranks_in_group``, ``group_id`` and ``_timeout`` when it
makes the group; ``hccl_config`` is checked as torch_npu checks it and kept on the group (``pg.options``) —
npusim's HCCL has no buffer size or QoS to apply it to.
"""

from __future__ import annotations

import datetime

from torch._C import _distributed_c10d as _c10d

OP_TIMEOUT = datetime.timedelta(minutes=30)        # kProcessGroupHCCLOpTimeoutMillis
_INT_KEYS = ("hccl_buffer_size", "qos_service_level", "qos_traffic_class", "hccl_op_expansion_mode")
_STR_KEYS = ("group_name",)


class Options(_c10d.Backend.Options):
    """torch_npu's ``ProcessGroupHCCL.Options()``: no arguments; set the fields on the instance."""

    def __init__(self, is_high_priority_stream: bool = False):
        super().__init__("hccl")
        self.op_timeout = OP_TIMEOUT
        self.is_high_priority_stream = bool(is_high_priority_stream)
        self.hccl_config: dict = {}
        self.group_id = ""

    def __repr__(self) -> str:
        return (f"ProcessGroupHCCL.Options(is_high_priority_stream={self.is_high_priority_stream}, "
                f"hccl_config={self.hccl_config!r}, op_timeout={self.op_timeout})")


def checked(options) -> Options:
    """``pg_options`` as the hccl backend takes it: None (the defaults) or an ``Options`` with a valid
    ``hccl_config``; a TypeError naming what was passed otherwise."""
    if options is None:
        return Options()
    if not isinstance(options, Options):
        raise TypeError(f"pg_options for the hccl backend must be torch_npu._C._distributed_c10d.ProcessGroupHCCL."
                        f"Options, not {type(options).__module__}.{type(options).__qualname__}")
    config = options.hccl_config
    if not isinstance(config, dict):
        raise TypeError(f"ProcessGroupHCCL.Options.hccl_config must be a dict, not {type(config).__name__}")
    for key in _INT_KEYS:
        if key in config and (not isinstance(config[key], int) or isinstance(config[key], bool)):
            raise RuntimeError(f"Value type of {key} should be int.")
    for key in _STR_KEYS:
        if key in config and not isinstance(config[key], str):
            raise RuntimeError(f"Value type of {key} should be string.")
    if not isinstance(options.is_high_priority_stream, bool):
        raise TypeError(f"ProcessGroupHCCL.Options.is_high_priority_stream must be a bool, not "
                        f"{type(options.is_high_priority_stream).__name__}")
    return options
