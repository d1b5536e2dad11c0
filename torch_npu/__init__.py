"""npusim's ``torch_npu``: run torch_npu scripts on simulated cards (``import torch_npu``, as on real hardware).

- ``torch.npu``: ``set_device``, ``current_device``, ``device_count``, ``synchronize``, ``is_available``, ...
  (``npu.py``), answered by the rank's npusim card;
- ``torch.distributed.init_process_group("hccl")``: a c10d backend whose collectives run on npusim's cards
  and HCCL (``distributed/``);
- ``npu`` device names map onto CPU tensors (``devices.py``; what is and is not simulated: docs/torch.md).

Needs PyTorch: ``pip install "npusim[torch]"`` (the CPU wheel). npusim's core never imports torch.
"""

try:
    import torch  # noqa: F401
except ImportError as e:                                  # pragma: no cover - depends on the install
    raise ImportError("npusim's torch_npu needs PyTorch: pip install \"npusim[torch]\" (CPU torch)") from e

from . import distributed, npu
from .devices import install as _install

__version__ = "2.13.0+npusim"

_install()
distributed.register()

__all__ = ["distributed", "npu"]
