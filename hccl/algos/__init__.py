"""Collective algorithms as pure schedules (mesh, ring, recursive halving-doubling, hierarchical),
their validator, the numpy executor and the algorithm choice."""

from . import hd, hierarchical, mesh, ring
from .schedule import Schedule, Transfer, buffer_sizes, run_numpy, validate
from .select import ALGORITHMS, DEFAULT_THRESHOLDS, build, choose, parse_hccl_algo, supports

__all__ = ["ALGORITHMS", "DEFAULT_THRESHOLDS", "Schedule", "Transfer", "buffer_sizes", "build", "choose",
           "hd", "hierarchical", "mesh", "parse_hccl_algo", "ring", "run_numpy", "supports", "validate"]
