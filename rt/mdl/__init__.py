"""Offline models (the ``.om`` analogue): the file format, ``GraphBuilder`` and the pyACL-named host API.

A model runs on a card (``rt/card/models.py``, ``rt/card/executor.py``); loading one across the ranks of
a communicator (batch- or tensor-sharded) is HCCL's: ``hccl.load_sharded``.
"""

from .api import *
from .api import __all__ as _api_names
from .builder import GraphBuilder, Value
from .format import ModelDef, Node, ValueInfo, Weight, parse, serialize

__all__ = [*_api_names, "GraphBuilder", "ModelDef", "Node", "Value", "ValueInfo", "Weight", "parse", "serialize"]
