"""``torch_npu.npu.npu_config``: compile and precision options (defined in ``torch_npu/npu_config.py``)."""

from ..npu_config import *  # noqa: F401,F403 - the same names
from ..npu_config import __all__  # noqa: F401
