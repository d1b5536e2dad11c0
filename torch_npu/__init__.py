"""npusim's ``torch_npu``: run torch_npu scripts on simulated cards (``import torch_npu``, as on real hardware).

- ``torch.npu``: ``set_device``, ``current_device``, ``device_count``, ``synchronize``, ``is_available``, ...
  (``npu.py``), answered by the rank's npusim card;
- ``torch.distributed.init_process_group("hccl")``: a c10d backend whose collectives run on npusim's cards
  and HCCL (``distributed/``);
- ``npu`` is a real torch device type: tensors on it compute with torch's CPU kernels and count against the
  card's memory (``devices.py``, ``backend.py``, ``storage.py``, ``memory.py``; what is simulated: docs/torch.md);
- torch_npu's storage formats and common fused ops (``formats.py``, ``ops.py``), registered as ``torch.ops.npu.*``
  for npu tensors (``op_plugin.py``); ``torch_npu.testing``.

Needs PyTorch: ``pip install "npusim[torch]"`` (the CPU wheel). npusim's core never imports torch.
"""

try:
    import torch  # noqa: F401
except ImportError as e:                                  # pragma: no cover - depends on the install
    raise ImportError("npusim's torch_npu needs PyTorch: pip install \"npusim[torch]\" (CPU torch)") from e

from . import _C, distributed, npu
from .amp import register_autocast_kernels as _register_autocast_kernels
from .devices import install as _install
from .formats import Format
from .op_plugin import (fast_gelu, get_npu_format, npu_add_rms_norm, npu_apply_rotary_pos_emb,
                        npu_confusion_transpose, npu_fast_gelu, npu_format_cast, npu_format_cast_,
                        npu_fusion_attention, npu_gelu, npu_rms_norm, npu_rotary_mul, npu_silu, npu_swiglu)

__version__ = "2.13.0+npusim"

_install()
distributed.register()
_register_autocast_kernels()

__all__ = ["Format", "distributed", "fast_gelu", "get_npu_format", "npu", "npu_add_rms_norm",
           "npu_apply_rotary_pos_emb", "npu_confusion_transpose", "npu_fast_gelu", "npu_format_cast",
           "npu_format_cast_", "npu_fusion_attention", "npu_gelu", "npu_rms_norm", "npu_rotary_mul", "npu_silu",
           "npu_swiglu"]
