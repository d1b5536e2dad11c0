"""Offline models (the ``.om`` analogue): file format, GraphBuilder, executor and the pyACL ``mdl`` API."""

from .api import *  # noqa: F401,F403  (pyACL-named host functions)
from .api import __all__ as _api_names
from .builder import GraphBuilder, Value
from .format import ModelDef, Node, ValueInfo, Weight, parse, serialize
from .shard import ShardedModel, load_sharded, plan_tensor

__all__ = [*_api_names, "GraphBuilder", "ModelDef", "Node", "Value", "ValueInfo", "Weight", "parse", "serialize",
           "ShardedModel", "load_sharded", "plan_tensor"]
