"""``torch_npu._C``: the names torch_npu programs reach in torch_npu's C extension, here in Python
(``_distributed_c10d``: ``ProcessGroupHCCL`` and its ``Options``)."""

from . import _distributed_c10d

__all__ = ["_distributed_c10d"]
