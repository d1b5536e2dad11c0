"""Sharded loading: one offline model across the ranks of a communicator (batch- or tensor-sharded)."""

from .model import ShardedModel, load_sharded
from .plan import Collective, RankPlan, plan_tensor

__all__ = ["Collective", "RankPlan", "ShardedModel", "load_sharded", "plan_tensor"]
