"""``torch_npu.distributed``: the ``"hccl"`` c10d backend on npusim cards (``process_group.py``), how a torch
job's ranks find their cards (``bootstrap.py``), and its Work (``work.py``)."""

from .process_group import ProcessGroupHCCL, register

__all__ = ["ProcessGroupHCCL", "register"]
