"""HCCL-style collective communication between npusim cards (see DESIGN §4 and docs/architecture.md).

``api``/``comm`` are what a rank calls; ``card/`` is HCCL's part of every card (plugged into the card's
extension seam); ``protocol/`` the shared-memory protocol both run; ``transport/`` what crosses
processes and nodes; ``algos/`` the pure schedules.
"""

from . import algos, types
from .api import (HCCL_RECV, HCCL_SEND, all_gather, all_reduce, all_to_all, all_to_all_v, barrier,
                  batch_send_recv, broadcast, recv, reduce, reduce_scatter, scatter, send)
from .comm import (HCCL_ROOT_INFO_BYTES, Communicator, RootInfo, comm_destroy, comm_init_all,
                   comm_init_cluster_info, comm_init_cluster_info_config, comm_init_root_info, comm_init_root_info_config, create_sub_comm, get_rank_id, get_rank_size,
                   get_root_info, init)
from .ddp import DataParallel, all_reduce_gradients, broadcast_parameters
from .sharding import ShardedModel, load_sharded, plan_tensor
from .types import *  # noqa: F401,F403  C names: HCCL_E_TIMEOUT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, ...
from .types import HcclDataType, HcclReduceOp, HcclResult
from .errors import HcclError
