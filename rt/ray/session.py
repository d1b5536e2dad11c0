"""Ray plumbing: the embedded local session, joining a cluster, and creating/finding card actors.

Ray is used to create, place, find and supervise cards (one named actor per card, pinned to its
node, holding one unit of the ``NPU`` resource); the hot path never goes through Ray. The embedded
session binds 127.0.0.1, runs no dashboard, turns on Ray's token authentication and bounds CPUs and
object store memory (see docs/security.md for what Ray itself still listens on).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
import uuid

from .. import copytune
from ..config import Config, check_object_store
from ..constants import AclErrorCode as E
from ..errors import AclError
from ..files import setup_dir, user_root_path
from ..host import reaper

NAMESPACE = "npusim"
# Caches of idle cards plug in here (the warm pool, rt/ray/pool.py, when it is imported — no idle card exists
# before): fn(node_id, count) before cards are created on a Ray node, to yield their NPUs; fn() before this
# process stops its Ray session, to destroy them.
BEFORE_CREATE: list = []
BEFORE_STOP: list = []
# The raylet connects to the object store it has just started; if the store is not listening yet it
# sleeps raylet_client_connect_timeout_milliseconds (Ray's default 1000, 10 attempts) before retrying,
# which made about every other ray.init here 1 s slower (2.2 s -> 3.3 s). Retry every 100 ms instead,
# with the same 10 s of patience.
FAST_CONNECT = {"raylet_client_connect_timeout_milliseconds": 100, "raylet_client_num_connect_attempts": 100}
_started_here = False


# Ray reads RAY_DEDUP_LOGS once, when it is imported (so import this module before ray): card output (rare:
# warnings are forwarded to the host, rt/card/queues.py) then reaches the console as written, without the
# "[repeated Nx across cluster]" banners and their docs URL.
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def _ray():
    import ray
    return ray


def socket_root(create: bool = True) -> str:
    """Per-user directory holding every job's card sockets (0700). Its name is predictable, so another local
    user may have made it first (or put a symbolic link there): such a directory is refused (AclError 507033
    naming it, its owner and mode), never used — our sockets and keys would be theirs to rename or replace.
    ``create=False``: the path only, checked if it exists (lookups such as ``npu-smi`` leave nothing behind)."""
    root = user_root_path()
    if create or os.path.lexists(root):
        setup_dir(root, "npusim's per-user directory",
                "; another user may have created it to take over npusim's sockets: remove it (root, or its "
                "owner, can), or point TMPDIR at a directory only you can write")
    return root


def new_job_id() -> str:
    return uuid.uuid4().hex[:12]


RAY_TEMP_MAX = 43        # Ray's socket paths (<temp>/session_<date>_<pid>/sockets/plasma_store) must stay < 108 bytes
_session_tag: str | None = None


def start_local_ray(cfg: Config, nodes: int = 1) -> None:
    """Start an embedded Ray session on 127.0.0.1 declaring ``cfg.cards_per_node`` NPUs for each of ``nodes``
    simulated servers (``launch --nnodes K`` on one machine: K nodes' cards on this one Ray node).

    Everything of it lives in a directory of ours (Ray's temp dir) and its processes carry a reaper tag, so a
    reaper removes both if this process dies without shutting Ray down (``rt/reaper.py``).
    """
    global _started_here, _session_tag
    ray = _ray()
    if ray.is_initialized():
        return
    check_object_store(cfg)          # before anything of Ray's exists: its own refusal is a traceback
    _enable_token_auth()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    token = reaper.new_tag()
    temp_dir = os.path.join(socket_root(), f"ray-{token.rsplit('-', 1)[1][:8]}")
    if len(temp_dir) > RAY_TEMP_MAX:
        # A long $TMPDIR: Ray's default (<TMPDIR>/ray) would be too long as well. A fresh 0700 directory of ours
        # in /tmp instead, so its session and session_latest go with it.
        temp_dir = tempfile.mkdtemp(prefix="npusim-ray-", dir="/tmp")
    reaper.tag(token)
    reaper.path(temp_dir, token)
    with _ray_start_environment(token):
        ray.init(
            address="local",                 # never attach to some other cluster running on this machine
            num_cpus=cfg.num_cpus,
            resources={"NPU": cfg.cards_per_node * nodes},
            object_store_memory=cfg.object_store_bytes,
            include_dashboard=False,
            namespace=NAMESPACE,
            _node_ip_address="127.0.0.1",
            _temp_dir=temp_dir,
            logging_level=logging.WARNING,
            log_to_driver=True,
            configure_logging=True,
            _system_config=dict(FAST_CONNECT),      # a copy: Ray adds this session's spilling directory to it
        )
    node = getattr(ray._private.worker, "_global_node", None)
    reaper.processes(token, _session_processes(node))
    _started_here, _session_tag = True, token


def _session_processes(node) -> list[int]:
    """Pids of the processes ``ray.init`` started and of their children (the raylet's agents): the reaper
    kills them by pid (the agents' environment, where the tag lives, is overwritten by their titles)."""
    import psutil
    pids = []
    for infos in (getattr(node, "all_processes", None) or {}).values():
        for info in infos:
            pid = getattr(getattr(info, "process", None), "pid", None)
            if pid is None:
                continue
            pids.append(pid)
            try:
                pids += [c.pid for c in psutil.Process(pid).children(recursive=True)]
            except psutil.Error:
                pass
    return pids


@contextlib.contextmanager
def _ray_start_environment(token: str):
    """What ``ray.init`` must see to start a session of simulated cards, undone once Ray's processes exist
    (they keep what they inherited):

    - no ``ASCEND_RT_VISIBLE_DEVICES``: Ray's NPU manager would refuse to start a raylet with more NPUs than
      the variable lists; the variable is for the user's process (``rt`` applies it), not for the cards;
      and ``RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES`` so card actors are not handed one either;
    - the reaper tag, inherited by exactly Ray's processes and what they start;
    - large copies with non-temporal stores (``rt/copytune.py``: ``GLIBC_TUNABLES``), in the cards' processes;
    - Ray's "enable cluster" constant off: otherwise it rewrites 127.0.0.1 to the host's primary address and
      every gRPC server listens on the wildcard address; with 127.0.0.1 kept, all of them bind loopback;
    - Ray's NPU detection silenced: with no real Ascend stack it logs a traceback while the node starts;
    - no autoscaler monitor, no API server (one fixed node scales nothing; npusim uses no HTTP API or job submission):
      two Python processes (~0.5 s of CPU each) and ``ray.init``'s poll for the API server, 0.6-1.8 s (issue 26).
    """
    from ray._private import ray_constants
    saved = {k: os.environ.get(k) for k in ("ASCEND_RT_VISIBLE_DEVICES", reaper.ENV,
                                            "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES", "GLIBC_TUNABLES")}
    tuned = copytune.tuned()            # read (and refused if bad) before anything changes
    os.environ.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    os.environ.update(tuned)
    os.environ.setdefault("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES", "1")
    os.environ[reaper.ENV] = token
    cluster = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    from ray._private.node import Node
    head = {name: Node.__dict__[name] for name in ("start_monitor", "start_api_server")}
    for name in head:
        setattr(Node, name, lambda self, *args, **kwargs: None)
    npu_log = logging.getLogger("ray._private.accelerators.npu")
    level = npu_log.level
    npu_log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        npu_log.setLevel(level)
        for name, method in head.items():
            setattr(Node, name, method)
        ray_constants.ENABLE_RAY_CLUSTER = cluster
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _enable_token_auth() -> None:
    """Turn on Ray's token authentication for the session we start (a fresh random token, kept in
    this process's environment and inherited by Ray's processes and our rank processes)."""
    if os.environ.get("RAY_AUTH_MODE", "token") != "token":
        return                                  # the user chose otherwise
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    try:
        from ray._raylet import Config
        Config.initialize("")                   # Ray caches the mode at import; refresh it
    except Exception:
        pass


def auth_env() -> dict:
    """RAY_AUTH_* of this process: what a process joining its session needs (a rank falling back to Ray, the
    borrower of a ``launch --up`` cluster's cards)."""
    return {key: os.environ[key] for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN") if key in os.environ}


def connect_ray(address: str, timeout: float = 30.0) -> None:
    """Join an existing cluster; an unreachable address fails fast with a message naming it."""
    ray = _ray()
    if ray.is_initialized():
        return
    host, _, port = address.rpartition(":")
    if address not in ("auto",) and port.isdigit():
        import socket
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=min(timeout, 5)).close()
        except OSError as e:
            raise AclError(E.ACL_ERROR_RT_DEV_SETUP_ERROR,
                           f"cannot reach the Ray cluster at {address!r}: {e} (is `ray start --head` running there?)") from None
    kwargs = {}
    if host in ("127.0.0.1", "localhost"):
        kwargs["_node_ip_address"] = "127.0.0.1"
        _keep_loopback()
    try:
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING, **kwargs)
    except Exception as e:  # ConnectionError, RuntimeError ... from Ray
        raise AclError(E.ACL_ERROR_RT_DEV_SETUP_ERROR, f"cannot join the Ray cluster at {address!r}: {e}") from None


def _keep_loopback() -> None:
    """Ray 2.60 rewrites a 127.0.0.1 cluster address to the host's primary IP before connecting
    (``resolve_ip_for_localhost``); our clusters listen on loopback and we send nothing off-host,
    so keep loopback addresses as given."""
    from ray._private import services
    if getattr(services.resolve_ip_for_localhost, "_npusim", False):
        return
    original = services.resolve_ip_for_localhost

    def resolve(host):
        return "127.0.0.1" if host in ("127.0.0.1", "localhost") else original(host)
    resolve._npusim = True
    services.resolve_ip_for_localhost = resolve


def stop_ray() -> None:
    """Shut Ray down if this process started it, idle cached cards first (and have the reaper end its lingering
    agents now)."""
    global _started_here, _session_tag
    ray = _ray()
    if _started_here and ray.is_initialized():
        for drain in BEFORE_STOP:
            drain()
        ray.shutdown()
        if _session_tag:
            reaper.sweep(_session_tag)
    _started_here, _session_tag = False, None


def nodes_with_npus() -> list[dict]:
    """Alive Ray nodes offering the NPU resource, in a stable order (the head node first)."""
    ray = _ray()
    out = []
    for n in ray.nodes():
        npus = int(n.get("Resources", {}).get("NPU", 0))
        if n.get("Alive") and npus > 0:
            out.append({"node_id": n["NodeID"], "ip": n["NodeManagerAddress"], "npus": npus})
    head = ray.get_runtime_context().get_node_id()
    out.sort(key=lambda d: (d["node_id"] != head, d["node_id"]))
    return out


def card_name(node: int, index: int) -> str:
    """The card actor's name, as DESIGN §1: ``npu:<node>:<id>`` (in the job's namespace, see card_namespace)."""
    return f"npu:{node}:{index}"


def card_namespace(job: str) -> str:
    """Each job (and each launcher restart) has its own Ray namespace, so concurrent jobs never share cards."""
    return f"{NAMESPACE}-{job}"


@dataclasses.dataclass
class CardSet:
    job: str
    node: int
    socket_dir: str
    actors: list
    created: bool
    pending: dict = dataclasses.field(default_factory=dict)   # readiness ref -> the card indices it covers
    board: object = None                  # the job's JobBoard (this handle keeps it alive while the cards live)
    shape: tuple | None = None            # set for warm cards of rt/ray/pool.py: the shape they are kept under
    warm: bool = False                    # lent again after a reset (not booted for this job)


def create_cards(job: str, node: int, node_id: str | None, cfg: Config, count: int | None = None,
                 socket_dir: str | None = None, timeout: float = 60.0, indices=None, wait: bool = True,
                 per_host: int = 1, parties: int = 0) -> CardSet:
    """Create (or find) the cards 0..count-1 (or ``indices``) of ``node``, pinned to Ray node ``node_id``: a
    ``CardActor`` each, or with ``per_host`` > 1 a ``CardHost`` per ``per_host`` of them (``rt/ray/actor.py``);
    ``parties``: the ranks of the whole job, which may all wait on its board at once."""
    from .actor import CardActor, CardHost
    from ..wire.channel import card_key
    count = cfg.cards_per_node if count is None else count
    for make_room in BEFORE_CREATE:            # idle warm cards yield their NPU
        make_room(node_id, len(indices) if indices is not None else count)
    socket_dir = setup_dir(socket_dir or os.path.join(socket_root(), job), f"card socket directory of job {job!r}")
    reaper.path(socket_dir)             # removed by destroy_cards, or by the reaper if we die first
    write_owner(socket_dir, job)
    key = card_key(socket_dir, create=True)   # what every connection to these cards must present
    # No runtime_env: with one, Ray boots every worker through its setup_worker.py shim (a second
    # interpreter importing Ray), which doubles a card's start-up CPU (0.31 -> 0.66 s measured) and
    # keeps it off the workers Ray prestarts.
    opts = dict(namespace=card_namespace(job), get_if_exists=True, num_cpus=0, resources={"NPU": 1},
                max_concurrency=64, max_restarts=0)
    if node_id is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    indices = list(range(count)) if indices is None else list(indices)
    if per_host > 1:
        groups = [tuple(indices[k:k + per_host]) for k in range(0, len(indices), per_host)]
        actors = [CardHost.options(name=f"{card_name(node, g[0])}+{len(g)}", **dict(opts, resources={"NPU": len(g)}))
                  .remote(node, list(g), cfg.to_dict(), socket_dir, opts["namespace"], key) for g in groups]
    else:
        groups = [(i,) for i in indices]
        actors = [CardActor.options(name=card_name(node, i), **opts).remote(node, i, cfg.to_dict(), socket_dir,
                                                                         opts["namespace"], key)
                  for i in indices]
    from .actor import job_board
    board = job_board(opts["namespace"], parties)  # boots beside the cards: their first rendezvous does not wait
    cards = CardSet(job, node, socket_dir, actors, True, {a.address.remote(): g for g, a in zip(groups, actors)},
                    board)
    if wait:
        wait_cards(cards, timeout)
    return cards


OWNER_FILE = "owner.json"


def write_owner(socket_dir: str, job: str) -> None:
    """Say who created the cards of ``socket_dir`` — this process (pid and start time, so a reused pid is told
    apart) — in ``owner.json`` beside their sockets: how ``npu-smi`` (``launcher/tools/smi.py``) names a session and
    tells a live one from a stale one. It goes with the directory (``destroy_cards``, ``forget_cards``, the
    reaper); a set created in steps keeps the first step's file. Best effort: never fails card creation."""
    path = os.path.join(socket_dir, OWNER_FILE)
    if os.path.exists(path):
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump({"pid": os.getpid(), "start_time": reaper.start_time(os.getpid()), "job": job,
                       "created": time.time()}, f)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def wait_cards(cards: "CardSet", timeout: float = 60.0, on_ready=None, every: float = 2.0) -> None:
    """Block until the card actors of ``cards`` serve their sockets; name the ones that did not. ``on_ready(n)``:
    told, at most every ``every`` seconds and at the end, how many more of them serve now."""
    ray = _ray()
    pending, cards.pending = dict(cards.pending), {}
    node = cards.node
    deadline = time.monotonic() + timeout
    while pending:
        left = max(0.0, deadline - time.monotonic())
        ready, _ = ray.wait(list(pending), num_returns=len(pending),
                            timeout=min(left, every) if on_ready is not None else left)
        if on_ready is not None and ready:
            on_ready(sum(len(pending[ref]) for ref in ready))
        for ref in ready:
            group = pending.pop(ref)
            try:
                ray.get(ref)
            except Exception as e:
                which = f"card {group[0]}" if len(group) == 1 else f"cards {list(group)} (one host)"
                raise AclError(E.ACL_ERROR_RT_DEV_SETUP_ERROR, f"{which} of node {node} failed to start: {e}") from None
        if pending and time.monotonic() >= deadline:
            missing = sorted(i for group in pending.values() for i in group)
            raise AclError(E.ACL_ERROR_RT_DEV_SETUP_ERROR,
                           f"cards {missing} of node {node} did not start within {timeout:.0f} s (not enough free "
                           f"'NPU' resources on that Ray node? available: {ray.available_resources().get('NPU', 0)})")


def destroy_cards(cards: CardSet) -> None:
    """Stop the card actors and remove their socket directory."""
    ray = _ray()
    refs = []
    for a in cards.actors:
        try:
            refs.append(a.shutdown.remote())
        except Exception:
            pass
    try:
        ray.wait(refs, num_returns=len(refs), timeout=10)
    except Exception:
        pass
    for a in cards.actors + ([cards.board] if cards.board is not None else []):
        try:
            ray.kill(a, no_restart=True)   # the board too: left to go out of scope, its threads crash at exit
        except Exception:
            pass
    forget_cards(cards)


def forget_cards(cards: CardSet) -> None:
    """Remove the socket directory of cards that are gone."""
    shutil.rmtree(cards.socket_dir, ignore_errors=True)
    reaper.forget(cards.socket_dir)
