"""npusim runtime: a pyACL-style API over simulated NPU cards (see DESIGN §2)."""

from . import constants
from .api import (DeviceInfo, Event, Stream, create_context, create_event, create_stream, current_card,
                  destroy_context, destroy_event, destroy_stream, device_can_access_peer,
                  device_enable_peer_access, empty_cache, event_elapsed_time, finalize, free, free_host,
                  get_context, get_device, get_device_count, get_device_info, get_mem_info, get_recent_err_msg,
                  get_soc_name, init, is_initialized, launch_callback, malloc, malloc_host, memcpy, memcpy_async,
                  memory_stats, memset, memset_async, query_event_status, record_event, reset_device,
                  reset_device_force, reset_event, set_context, set_device, stream_query, stream_wait_event,
                  synchronize_device, synchronize_event, synchronize_stream, synchronize_stream_with_timeout)
from .constants import *  # noqa: F401,F403  C names: ACL_MEMCPY_HOST_TO_DEVICE, ACL_ERROR_RT_MEMORY_ALLOCATION, ...
from .constants import (BFLOAT16, HBM, MEM_MALLOC_HUGE_FIRST, MEM_MALLOC_HUGE_ONLY, MEM_MALLOC_NORMAL_ONLY,
                        CallbackBlockType, DataType, EventRecordedStatus, EventStatus, MemAttr, MemcpyKind,
                        MemMallocPolicy, StreamStatus, data_type_size, np_dtype)
from .context import Context
from .errors import AclError, HcclError, NpuError
from .hostmem import HostBuffer
from .tensor import KernelFunction, Tensor, empty, kernel, launch_kernel, sleep_kernel


def __getattr__(name):
    # rt.ops and rt.mdl are imported on first use: they pull in the kernel library, which card
    # actors and simple host scripts do not always need.
    if name in ("ops", "mdl"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    if name in ("create_data_buffer", "destroy_data_buffer", "get_data_buffer_addr", "get_data_buffer_size_v2"):
        from .mdl import api as _mdl_api
        return getattr(_mdl_api, name)
    raise AttributeError(f"module 'rt' has no attribute {name!r}")
