"""npusim runtime: a pyACL-style API over simulated NPU cards (see DESIGN §2 and docs/architecture.md).

The code is grouped by the process it runs in: ``rt/host/`` in the rank's own process, ``rt/card/`` in
the card actor, ``rt/wire/`` between the two, ``rt/ray/`` the Ray shell; ``rt/diag/`` holds the diagnostics
(flight recorder, race detector, fault injection — observers of the host's seam, ``rt/host/seam.py`` — and
the CANN log); the modules at this level are shared by both sides. ``rt.faults`` (fault injection) and
``rt.slog`` (the log) are ``rt/diag/``'s modules.
"""

from . import constants, mdl, ops
from .constants import *  # noqa: F401,F403  C names: ACL_MEMCPY_HOST_TO_DEVICE, ACL_ERROR_RT_MEMORY_ALLOCATION, ...
from .constants import (HBM, MEM_MALLOC_HUGE_FIRST, MEM_MALLOC_HUGE_ONLY, MEM_MALLOC_NORMAL_ONLY, CallbackBlockType,
                        DataType, EventRecordedStatus, EventStatus, MemAttr, MemcpyKind, MemMallocPolicy, StreamStatus)
from .diag import faults, racecheck, recorder, slog  # noqa: F401  the observers register with the seam here
from .diag.racecheck import RaceError, RaceWarning
from .diag.recorder import dump as trace_dump
from .dtypes import BFLOAT16, acl_dtype, data_type_size, np_dtype
from .errors import AclError, NpuError
from .host.copies import memcpy, memcpy_async, memset, memset_async
from .host.devices import (DeviceInfo, create_context, current_card, destroy_context, device_can_access_peer,
                           device_enable_peer_access, finalize, get_context, get_device, get_device_count,
                           get_device_info, get_mem_info, get_recent_err_msg, get_soc_name, init, is_initialized,
                           reset_device, reset_device_force, set_context, set_device)
from .host.hostmem import HostBuffer
from .host.memory import empty_cache, free, free_host, malloc, malloc_host, memory_stats
from .host.runtime import Context
from .host.streams import (Event, Stream, create_event, create_stream, destroy_event, destroy_stream,
                           event_elapsed_time, launch_callback, query_event_status, record_event, reset_event,
                           stream_query, stream_wait_event, synchronize_device, synchronize_event,
                           synchronize_stream, synchronize_stream_with_timeout)
from .host.tensor import KernelFunction, Tensor, empty, kernel, launch_kernel, sleep_kernel
from .mdl import create_data_buffer, destroy_data_buffer, get_data_buffer_addr, get_data_buffer_size_v2
