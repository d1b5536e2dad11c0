"""Host-side communicators: root info, init (root info, rank table, all devices, sub-comms), destroy."""

from __future__ import annotations

import hashlib
import os
import re
import threading
import uuid

import rt
from rt import args
from rt.diag import slog
from rt.host.runtime import RUNTIME
from rt.wire import extensions

from . import hostpath
from .algos import parse_hccl_algo
from .config import CONNECT_TIMEOUT_RANGE, EXEC_TIMEOUT_MAX
from .errors import HcclError, hccl_para
from .handle import CommHandle, _check_comm
from .ranktable import load_rank_table
from .tensor_ops import TensorCollectives
from .types import HcclResult

# Every card this process talks to handles hccl_* commands with HCCL's card extension.
extensions.declare("hccl", "hccl.card.extension:HcclExtension")

HCCL_ROOT_INFO_BYTES = 4108
MAX_RANKS = 1 << 16
_cluster_inits: dict[tuple[str, int], int] = {}     # (table digest, rank) -> inits so far
_cluster_lock = threading.Lock()


class RootInfo:
    """Opaque, serializable identity of a communicator-to-be (HcclRootInfo): pass it to every rank."""

    def __init__(self, comm_id: str | None = None):
        self.id = comm_id or uuid.uuid4().hex[:16]

    def to_bytes(self) -> bytes:
        raw = b"npusim-root:" + self.id.encode()
        return raw.ljust(HCCL_ROOT_INFO_BYTES, b"\0")

    @classmethod
    def from_bytes(cls, data: bytes) -> RootInfo:
        raw = bytes(data) if isinstance(data, (bytes, bytearray)) else b""
        ident = raw[12:].rstrip(b"\0")
        if not raw.startswith(b"npusim-root:") or not ident or not ident.isalnum() or len(ident) > 64:
            raise HcclError(HcclResult.HCCL_E_PARA, "root info bytes were not produced by hccl.get_root_info()")
        return cls(ident.decode())

    def __eq__(self, other):
        return isinstance(other, RootInfo) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"RootInfo({self.id!r})"


class Communicator(CommHandle, TensorCollectives):
    """One rank's handle on a communicator, bound to one card (the device current at init): its state and the
    pointer-level API's check come from ``CommHandle`` (``hccl/handle.py``), the ``rt.Tensor`` methods
    (``comm.all_reduce(t)``, ...) from ``TensorCollectives`` (``hccl/tensor_ops.py``)."""


_DECIMAL = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")


def _env_seconds(name: str, default: float, lo: float, hi: float) -> float:
    """A timeout variable: plain decimal seconds in [lo, hi] (CANN's range). float() would also take 'nan',
    'inf', '1_0' and non-ASCII digits: nan never times out, inf overflows every wait."""
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return float(default)
    value = float(text) if _DECIMAL.fullmatch(text.strip()) else None
    if value is None or not lo <= value <= hi:
        raise HcclError(HcclResult.HCCL_E_PARA, f"{name}={args.shown(text)}: expected a number of seconds in "
                                                f"[{lo}, {hi}]")
    return value


def options_from_env() -> dict:
    """HCCL settings from this process's environment (they travel with every init request)."""
    cfg = RUNTIME.cfg
    exec_timeout = _env_seconds("HCCL_EXEC_TIMEOUT", cfg.exec_timeout if cfg else 1836, 0, EXEC_TIMEOUT_MAX)
    algo = os.environ.get("HCCL_ALGO", "")
    if algo:
        parse_hccl_algo(algo)        # raises HCCL_E_PARA naming the bad part
    det = os.environ.get("HCCL_DETERMINISTIC", "false").lower()
    if det not in ("true", "false", "strict", "1", "0"):
        raise HcclError(HcclResult.HCCL_E_PARA, f"HCCL_DETERMINISTIC={det!r} (expected true, false or strict)")
    return {"exec_timeout": exec_timeout or 1e9,          # 0 means "never" in CANN's host modes
            "connect_timeout": _env_seconds("HCCL_CONNECT_TIMEOUT", cfg.connect_timeout if cfg else 120,
                                            *CONNECT_TIMEOUT_RANGE),
            "algo": algo, "deterministic": det in ("true", "strict", "1")}


def get_root_info() -> RootInfo:
    """Create the identity of a new communicator (call on the root rank and share it with the others)."""
    return RootInfo()


def _check_rank(nranks, rank, call):
    if isinstance(nranks, bool) or not isinstance(nranks, int) or not 1 <= nranks <= MAX_RANKS:
        raise HcclError(HcclResult.HCCL_E_PARA, f"{call}: nranks must be an int >= 1, got {args.shown(nranks)}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < nranks:
        raise HcclError(HcclResult.HCCL_E_PARA, f"{call}: rank {args.shown(rank)} is outside [0, {nranks})")


_many = threading.local()            # set in comm_init_all's threads: one process, several ranks


def _init(ctx, comm_id: str, nranks: int, rank: int, call: str, config: dict | None = None) -> Communicator:
    opts = options_from_env()
    opts.update(config or {})
    # where this process would lead its node's rounds across nodes (hccl/transport/leaders.py); a process
    # driving several ranks of one communicator never blocks in one rank's call, so it never leads
    opts["host_link"] = None if getattr(_many, "on", False) else hostpath.host_link(ctx)
    reply = ctx.client.call("hccl_init", comm_id, nranks, rank, opts, pass_req=True,
                            timeout=opts["connect_timeout"] + 30,
                            timeout_error=lambda: HcclError(HcclResult.HCCL_E_TIMEOUT,
                                                            f"{call}: card {ctx.physical} did not answer"))
    slog.info(slog.HCCL, "%s: communicator '%s' ready, rank %d of %d on card %d (node %d)", call, comm_id, rank,
              nranks, ctx.physical, ctx.node)
    comm = Communicator(ctx, comm_id, rank, nranks, reply["members"], opts)
    comm.lead = hostpath.start_lead(comm, reply.get("host_links"))
    return comm


def comm_init_root_info(nranks: int, root_info: RootInfo, rank: int) -> Communicator:
    """Join the communicator of ``root_info`` as ``rank`` of ``nranks``, on the current device."""
    _check_rank(nranks, rank, "comm_init_root_info")
    if isinstance(root_info, (bytes, bytearray)):
        root_info = RootInfo.from_bytes(root_info)
    if not isinstance(root_info, RootInfo):
        raise HcclError(HcclResult.HCCL_E_PARA, f"comm_init_root_info: root_info {args.shown(root_info)} is not "
                                                f"a RootInfo")
    ctx = RUNTIME.require_current("comm_init_root_info")
    return _init(ctx, root_info.id, nranks, rank, "comm_init_root_info")


CONFIG_KEYS = {"exec_timeout": "seconds a collective waits for its peers (HcclCommConfig.hcclExecTimeOut)",
               "deterministic": "bit-identical reductions (hcclDeterministic)"}


def comm_init_root_info_config(nranks: int, root_info: RootInfo, rank: int, config: dict) -> Communicator:
    """HcclCommInitRootInfoConfig: ``comm_init_root_info`` with settings of this communicator overriding the
    environment's: ``{"exec_timeout": s, "deterministic": bool}`` (HcclCommConfig's fields, snake_case)."""
    call = "comm_init_root_info_config"
    cfg = _comm_config(config, call)
    _check_rank(nranks, rank, call)
    if isinstance(root_info, (bytes, bytearray)):
        root_info = RootInfo.from_bytes(root_info)
    if not isinstance(root_info, RootInfo):
        raise HcclError(HcclResult.HCCL_E_PARA, f"{call}: root_info {args.shown(root_info)} is not a RootInfo")
    ctx = RUNTIME.require_current(call)
    return _init(ctx, root_info.id, nranks, rank, call, cfg)


def _comm_config(config, call: str) -> dict:
    """An HcclCommConfig as a dict (keys of CONFIG_KEYS), checked: the settings that override the environment."""
    if not isinstance(config, dict) or set(config) - set(CONFIG_KEYS):
        raise HcclError(HcclResult.HCCL_E_PARA, f"{call}: config {args.shown(config)} must be a dict with keys from "
                                                f"{sorted(CONFIG_KEYS)}")
    cfg = {}
    if "exec_timeout" in config:
        t = args.number(config["exec_timeout"], call, "exec_timeout", hi=EXEC_TIMEOUT_MAX, error=hccl_para)
        cfg["exec_timeout"] = t or 1e9
    if "deterministic" in config:
        cfg["deterministic"] = bool(config["deterministic"])
    return cfg


def comm_init_all(devices) -> list[Communicator]:
    """One process, several cards: a communicator over ``devices`` (rank i on devices[i])."""
    devices = args.int_list(devices, "comm_init_all", "devices", hi=1 << 16, error=hccl_para)
    if not devices or len(set(devices)) != len(devices):
        raise HcclError(HcclResult.HCCL_E_PARA, f"comm_init_all: devices {devices} must be non-empty and distinct")
    for d in devices:
        RUNTIME.physical(d)
    root = get_root_info()
    comms: list = [None] * len(devices)
    errs: list = []

    def one(i, dev):
        _many.on = True
        try:
            rt.set_device(dev)
            comms[i] = comm_init_root_info(len(devices), root, i)
        except Exception as e:  # noqa: BLE001 - collected and re-raised below
            errs.append(e)

    threads = [threading.Thread(target=one, args=(i, d)) for i, d in enumerate(devices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errs:
        raise errs[0]
    return comms


def comm_init_cluster_info(rank_table_path: str, rank: int) -> Communicator:
    """Join the communicator described by a rank table (JSON v1.0) as ``rank``; binds the card named there."""
    return _cluster_info(rank_table_path, rank, "comm_init_cluster_info", None)


def comm_init_cluster_info_config(rank_table_path: str, rank: int, config: dict) -> Communicator:
    """HcclCommInitClusterInfoConfig: ``comm_init_cluster_info`` with this communicator's settings overriding the
    environment's (``config`` as for ``comm_init_root_info_config``)."""
    call = "comm_init_cluster_info_config"
    return _cluster_info(rank_table_path, rank, call, _comm_config(config, call))


def _cluster_info(rank_table_path: str, rank: int, call: str, config: dict | None) -> Communicator:
    table = load_rank_table(rank_table_path)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank not in table.devices:
        raise HcclError(HcclResult.HCCL_E_PARA, f"{call}: rank {args.shown(rank)} is not in "
                                                f"{rank_table_path} "
                                                f"(rank_ids {sorted(table.devices)})")
    server, device_id = table.devices[rank]
    RUNTIME.require()
    if server != RUNTIME.node:
        raise HcclError(HcclResult.HCCL_E_PARA, f"{call}: rank {rank} belongs to server {server} of "
                                                f"the rank table, but this process runs on node {RUNTIME.node}")
    try:
        logical = RUNTIME.visible.index(device_id)
    except ValueError:
        raise HcclError(HcclResult.HCCL_E_PARA, f"{call}: device_id {device_id} of rank {rank} is "
                                                f"not visible to this process (visible cards {RUNTIME.visible})") from None
    cur = RUNTIME.current
    if cur is None or cur.physical != device_id:
        rt.set_device(logical)
    digest = hashlib.sha1(table.text.encode()).hexdigest()[:12]
    job = os.environ.get("NPUSIM_JOB", "")
    # The n-th init of this rank from this table: counted per rank, so ranks agree on the id whether
    # they live in separate processes or in threads of one process.
    with _cluster_lock:
        nth = _cluster_inits[(digest, rank)] = _cluster_inits.get((digest, rank), 0) + 1
    comm_id = f"rt-{digest}-{job}-{os.environ.get('RESTART_COUNT', '0')}-{nth}"
    return _init(RUNTIME.current, comm_id, table.size, rank, call, config)


def create_sub_comm(comm: Communicator, rank_ids, sub_comm_id: int, sub_rank: int,
                    config: dict | None = None) -> Communicator | None:
    """HcclCreateSubCommConfig: members pass the ordered global ranks (``sub_rank``: this rank's index there)
    and a ``sub_comm_id`` unique in ``comm`` (the sub-communicator is named ``<comm>_sub_<id>``), plus an
    optional ``config`` as for ``comm_init_root_info_config``; non-members pass None and get None."""
    _check_comm(comm, "create_sub_comm")
    cfg = None if config is None else _comm_config(config, "create_sub_comm")
    if rank_ids is None:
        return None
    ids = args.int_list(rank_ids, "create_sub_comm", "rank_ids", error=hccl_para)
    sub_comm_id = args.integer(sub_comm_id, "create_sub_comm", "sub_comm_id", hi=(1 << 32) - 1, error=hccl_para)
    if sorted(set(ids)) != ids or not ids or ids[0] < 0 or ids[-1] >= comm.size:
        raise HcclError(HcclResult.HCCL_E_PARA, f"create_sub_comm: rank_ids {ids} must be ascending, distinct ranks "
                                                f"of comm '{comm.id}' (size {comm.size})")
    if comm.rank not in ids:
        raise HcclError(HcclResult.HCCL_E_PARA, f"create_sub_comm: rank {comm.rank} is not in rank_ids {ids}; "
                                                f"non-members pass rank_ids=None")
    if not args.is_int(sub_rank) or sub_rank != ids.index(comm.rank):
        raise HcclError(HcclResult.HCCL_E_PARA, f"create_sub_comm: sub_rank {args.shown(sub_rank)} but global "
                                                f"rank {comm.rank} "
                                                f"is at index {ids.index(comm.rank)} of rank_ids")
    return _init(comm.ctx, f"{comm.id}_sub_{sub_comm_id}", len(ids), sub_rank, "create_sub_comm", cfg)


def comm_destroy(comm: Communicator) -> None:
    _check_comm(comm, "comm_destroy")
    slog.info(slog.HCCL, "comm_destroy: communicator '%s', rank %d of %d", comm.id, comm.rank, comm.size)
    comm.destroyed = True
    if comm.lead is not None:
        comm.lead.stop()
    comm._host = None                  # unmaps the control block (the cards release theirs)
    hostpath.left(comm.id)
    if not comm.ctx.destroyed and not comm.ctx.client.lost:
        comm.ctx.client.call("hccl_destroy", comm.id, comm.rank)


def get_rank_size(comm: Communicator) -> int:
    return _check_comm(comm, "get_rank_size").size


def get_rank_id(comm: Communicator) -> int:
    return _check_comm(comm, "get_rank_id").rank


def world_board_prefix(job: str) -> str:
    """Where the rendezvous of job ``job``'s world communicators (``init``) is kept on the job's board: what
    ``launch`` counts for "ranks joined n/N"."""
    return f"hccl/world-{job}-"


_world: Communicator | None = None
_world_inits = 0


def init() -> Communicator:
    """The world communicator of a process started by ``launch``/``spawn`` (reads RANK, WORLD_SIZE,
    DEVICE_ID; calls ``rt.init()`` and ``rt.set_device`` first when needed)."""
    global _world
    if _world is not None and not _world.destroyed:
        return _world
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        raise HcclError(HcclResult.HCCL_E_PARA, "hccl.init(): RANK and WORLD_SIZE are not set — start the script "
                                                "with `launch --nproc N script.py` (or use comm_init_root_info)") from None
    device = int(os.environ.get("DEVICE_ID", os.environ.get("LOCAL_RANK", "0")))
    if not rt.is_initialized():
        rt.init()
    if RUNTIME.current is None:
        rt.set_device(device)
    global _world_inits
    _world_inits += 1                  # every rank counts alike: init, destroy, init again gets a new id
    comm_id = f"world-{os.environ.get('NPUSIM_JOB', 'local')}-{os.environ.get('RESTART_COUNT', '0')}-{_world_inits}"
    _world = _init(RUNTIME.current, comm_id, world, rank, "hccl.init")
    return _world
