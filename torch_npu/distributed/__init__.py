"""``torch_npu.distributed``: the ``"hccl"`` c10d backend on npusim cards (``process_group.py``: ProcessGroupHCCL's
argument forms, ``checks.py``: its checks and texts, ``routing.py``: which backend serves CPU tensors,
``collectives.py``: what runs on the card), how a torch job's
ranks find their cards (``bootstrap.py``), and its Work (``work.py``)."""

from .process_group import ProcessGroupHCCL, register

__all__ = ["ProcessGroupHCCL", "register"]
