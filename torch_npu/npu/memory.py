"""``torch_npu.npu.memory``: the caching allocator's statistics and controls (defined in ``torch_npu/memory.py``)."""

from ..memory import *  # noqa: F401,F403 - the same names
from ..memory import __all__  # noqa: F401
