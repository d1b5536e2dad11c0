"""``torch.npu`` (also ``torch_npu.npu``): the NPU calls torch_npu scripts make, answered by npusim's cards.

torch_npu's submodule layout: ``utils`` (``set_device``, ``synchronize``, ``device(i)``, the SoC's answers:
``get_soc_version``, ``is_support_inf_nan``, ``get_cann_version``...), ``properties`` (``get_device_name``,
``get_device_properties``...), ``memory`` (the caching allocator's statistics, ``set_per_process_memory_fraction``),
``streams``, ``random``, ``amp``, ``npu_config`` (options), ``graphs`` (graph capture: not simulated, says so),
``tensor_types`` (``torch.npu.FloatTensor``...). This module re-exports their names. What is and is not
simulated: ``docs/torch.md``.
"""

import sys

import torch

from .. import amp
from ..amp import (get_amp_supported_dtype, get_autocast_dtype, is_autocast_enabled, set_autocast_dtype,
                   set_autocast_enabled)
from ..distributed.bootstrap import current_device, device_count
from ..memory import (caching_allocator_alloc, caching_allocator_delete, empty_cache,
                      get_per_process_memory_fraction, host_memory_stats, host_memory_stats_as_nested_dict,
                      max_memory_allocated, max_memory_cached, max_memory_reserved, mem_get_info, memory_allocated,
                      memory_cached, memory_reserved, memory_snapshot, memory_stats, memory_stats_as_nested_dict,
                      memory_summary, reset_accumulated_host_memory_stats, reset_accumulated_memory_stats,
                      reset_max_memory_allocated, reset_max_memory_cached, reset_peak_host_memory_stats,
                      reset_peak_memory_stats, set_per_process_memory_fraction)
from ..npu_config import (CubeMathType, config, conv, get_mm_bmm_format_nd, is_jit_compile_false, matmul, set_aoe,
                          set_compile_mode, set_mm_bmm_format_nd, set_option)
from ..rng import (get_rng_state, get_rng_state_all, initial_seed, manual_seed, manual_seed_all, seed, seed_all,
                   set_rng_state, set_rng_state_all)
from ..streams import Event, Stream, StreamContext, current_stream, default_stream, set_stream, stream
from . import graphs, memory, npu_config, properties, random, streams, tensor_types, utils
from .graphs import NPUGraph, graph, graph_pool_handle, is_current_stream_capturing, make_graphed_callables
from .properties import (NPUDeviceProperties, _is_in_bad_fork, can_device_access_peer, get_device_capability,
                         get_device_name, get_device_properties, init, is_available, is_initialized, utilization)
from .tensor_types import (BFloat16Tensor, BoolTensor, ByteTensor, CharTensor, DoubleTensor, FloatTensor,
                           HalfTensor, IntTensor, LongTensor, ShortTensor)
from .utils import (clear_npu_overflow_flag, current_blas_handle, device, device_of, get_cann_version,
                    get_npu_overflow_flag, get_soc_version, get_sync_debug_mode, ipc_collect, is_bf16_supported,
                    is_support_inf_nan, npu_check_overflow, set_device, set_sync_debug_mode, synchronize)

sys.modules.setdefault(__name__ + ".amp", amp)      # `from torch_npu.npu.amp import GradScaler`

_lazy_init = init
default_generators = (torch.default_generator,) * device_count()   # one shared generator (rng.py)

__all__ = ["BFloat16Tensor", "BoolTensor", "ByteTensor", "CharTensor", "CubeMathType", "DoubleTensor", "Event",
           "FloatTensor", "HalfTensor", "IntTensor", "LongTensor", "NPUDeviceProperties", "NPUGraph", "ShortTensor",
           "Stream", "StreamContext", "amp", "caching_allocator_alloc", "caching_allocator_delete",
           "can_device_access_peer", "clear_npu_overflow_flag", "config", "conv", "current_blas_handle",
           "current_device", "current_stream", "default_generators", "default_stream", "device", "device_count",
           "device_of", "empty_cache", "get_amp_supported_dtype", "get_autocast_dtype", "get_cann_version",
           "get_device_capability", "get_device_name", "get_device_properties", "get_mm_bmm_format_nd",
           "get_npu_overflow_flag", "get_per_process_memory_fraction", "get_rng_state", "get_rng_state_all",
           "get_soc_version", "get_sync_debug_mode", "graph", "graph_pool_handle", "host_memory_stats",
           "host_memory_stats_as_nested_dict", "init", "initial_seed", "ipc_collect", "is_autocast_enabled",
           "is_available", "is_bf16_supported", "is_current_stream_capturing", "is_initialized",
           "is_jit_compile_false", "is_support_inf_nan", "make_graphed_callables", "manual_seed",
           "manual_seed_all", "matmul", "max_memory_allocated", "max_memory_cached", "max_memory_reserved",
           "mem_get_info", "memory_allocated", "memory_cached", "memory_reserved", "memory_snapshot",
           "memory_stats", "memory_stats_as_nested_dict", "memory_summary", "npu_check_overflow",
           "reset_accumulated_host_memory_stats", "reset_accumulated_memory_stats", "reset_max_memory_allocated",
           "reset_max_memory_cached", "reset_peak_host_memory_stats", "reset_peak_memory_stats", "seed",
           "seed_all", "set_aoe", "set_autocast_dtype", "set_autocast_enabled", "set_compile_mode", "set_device",
           "set_mm_bmm_format_nd", "set_option", "set_per_process_memory_fraction", "set_rng_state",
           "set_rng_state_all", "set_stream", "set_sync_debug_mode", "stream", "synchronize", "utilization"]
