"""``torch_npu._C._distributed_c10d``: the hccl backend's classes, as torch_npu's C extension exposes them
(``ProcessGroupHCCL``, ``ProcessGroupHCCL.Options`` for ``pg_options``)."""

from ..distributed.process_group import ProcessGroupHCCL

__all__ = ["ProcessGroupHCCL"]
