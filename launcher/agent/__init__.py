"""The node agent: runs in the launching process for its own node (``launch``, ``spawn``, ``hccl-test``, a job
borrowing the ``launch --up`` cluster) and as a Ray actor on every other node. It starts the rank processes
(forked from the fork server when it can), reads their output and reports their exits."""

from .node_agent import NodeAgent
from .ranks import RankSpec

__all__ = ["NodeAgent", "RankSpec"]
