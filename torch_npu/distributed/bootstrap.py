"""Where a torch rank's cards come from: ``launch``'s, the rank's own, or — under ``torchrun`` and plain
``env://`` jobs — cards hosted by rank 0 and shared with the other ranks through the c10d store; and which of
them the process is bound to (``torch.npu.set_device``'s, used by ``torch.npu`` and the process groups alike).

- Under ``launch`` / ``spawn`` (``NPUSIM_CARD_DIR`` set) the job's cards already run; ``rt.init()`` reaches
  them over their sockets.
- A single rank (world size 1), or ``NPUSIM_BACKEND=local``: ``rt.init()`` as usual.
- Several ranks started by someone else (``torchrun``, ``torch.multiprocessing``, a shell loop): rank 0 starts
  an embedded Ray session on 127.0.0.1 (or joins ``RAY_ADDRESS``) and creates the node's card actors; it
  publishes their socket directory in the store, and every rank, rank 0 too, reaches the cards over those
  sockets as a ``launch`` rank does. Cards live as long as rank 0: at exit rank 0 first closes its own
  channels (its peers' next collective then fails at once naming rank 0, instead of hanging), waits for the
  other ranks to exit, then stops the cards and Ray. If rank 0 is killed, the reaper removes them.
"""

from __future__ import annotations

import atexit
import glob
import os
import select
import socket
import threading
import time

import rt
from rt.config import load_config
from rt.constants import AclErrorCode as E
from rt.errors import AclError
from rt.host.runtime import parse_visible

KEY = "npusim/cards"             # store key: "<hostname>\n<socket dir>\n<job>" published by rank 0
EXIT_WAIT = 600.0                # seconds rank 0 waits at exit for the other ranks before stopping the cards
_lock = threading.Lock()
_hosted = None                   # the CardSet rank 0 hosts
_device: int | None = None       # the card this process is bound to (set_device), None until chosen


def runtime_ready_without_store() -> bool:
    """True if ``rt`` can start now, before any process group exists (no cards need sharing)."""
    return rt.is_initialized() or bool(os.environ.get("NPUSIM_CARD_DIR")) or bool(os.environ.get("NPUSIM_BACKEND"))


def ensure_runtime(store=None, rank: int = 0, world_size: int = 1, timeout: float = 1800.0) -> None:
    """Initialize ``rt`` for this rank (see the module docstring); idempotent."""
    with _lock:
        if rt.is_initialized():
            return
        if os.environ.get("NPUSIM_CARD_DIR") or world_size == 1 or store is None:
            rt.init()
            return
        if os.environ.get("NPUSIM_BACKEND") == "local":
            raise AclError(E.ACL_ERROR_INVALID_PARAM,
                           f"init_process_group: NPUSIM_BACKEND=local runs the cards inside one process, but this "
                           f"job has {world_size} processes; unset it (or use launch)")
        if rank == 0:
            _host_cards(store)
        _join_cards(store, rank, timeout)


def device_count() -> int:
    """Visible cards: ``ASCEND_RT_VISIBLE_DEVICES`` over the config's cards per node (never starts anything)."""
    if rt.is_initialized():
        return rt.get_device_count()
    return len(parse_visible(os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), load_config(None).cards_per_node))


def choose_device(index: int) -> None:
    """``torch.npu.set_device``: the card this process binds to (checked by the caller)."""
    global _device
    _device = index


def _torch_current(index: int) -> None:
    """Make ``index`` torch's current npu device of the calling thread too, so that ``t.to("npu")`` lands there
    as ``torch.zeros(..., device="npu")`` does (torch asks the device guard, not ``torch.npu``). Needs the runtime
    running: torch initializes the backend first (``torch.npu.init``)."""
    import torch
    if torch._C._get_privateuse1_backend_name() == "npu" and torch.accelerator.is_available():
        torch.accelerator.set_device_index(index)


def current_device() -> int:
    """The bound card: ``set_device``'s, else ``LOCAL_RANK`` (as ``launch`` and ``torchrun`` map ranks), else 0."""
    if _device is not None:
        return _device
    local = os.environ.get("LOCAL_RANK")
    return int(local) % max(device_count(), 1) if local and local.isdigit() else 0


def bind() -> int:
    """Start the runtime if needed and make the bound card current on the calling thread."""
    ensure_runtime()
    index = current_device()
    rt.set_device(index)
    _torch_current(index)
    return index


def _host_cards(store) -> None:
    """Rank 0: a Ray session and the node's card actors, published to the other ranks."""
    global _hosted
    import ray

    from rt.ray import session
    cfg = load_config(None)
    address = os.environ.get("RAY_ADDRESS")
    if address:
        session.connect_ray(address)
    else:
        session.start_local_ray(cfg)
    job = os.environ.get("NPUSIM_JOB") or f"torch-{session.new_job_id()}"
    node_id = ray.get_runtime_context().get_node_id()
    _hosted = session.create_cards(job, 0, node_id, cfg)
    atexit.register(_stop_hosted)               # registered before rt's own exit hook, so it runs after it
    store.set(KEY, f"{socket.gethostname()}\n{_hosted.socket_dir}\n{job}")


def _join_cards(store, rank: int, timeout: float) -> None:
    """Every rank: reach rank 0's cards over their sockets (``rt`` then works as under ``launch``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            host, card_dir, job = store.get(KEY).decode().split("\n")
            break
        except Exception as e:  # noqa: BLE001 - the store's own timeout error, or rank 0 still starting
            if time.monotonic() >= deadline:
                raise AclError(E.ACL_ERROR_RT_DEV_SETUP_ERROR,
                               f"init_process_group: rank {rank} waited {timeout:g} s for rank 0 to start the "
                               f"job's cards and got nothing ({type(e).__name__}: {e})") from None
    if host != socket.gethostname():
        raise AclError(E.ACL_ERROR_RT_DEV_SETUP_ERROR,
                       f"init_process_group: rank {rank} runs on {socket.gethostname()!r}, but rank 0 hosts the "
                       f"cards on {host!r}: without launch, npusim's torch ranks must share one machine "
                       f"(use `launch --nnodes N` on a Ray cluster for several)")
    os.environ.update({"NPUSIM_CARD_DIR": card_dir, "NPUSIM_NODE": "0", "NPUSIM_JOB": job})
    with open(os.path.join(card_dir, f"torch-rank-{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    rt.init()


def _stop_hosted() -> None:
    """Rank 0 at exit: its own channels close first (rt's exit hook ran), then the others get to finish."""
    global _hosted
    cards, _hosted = _hosted, None
    if cards is None:
        return
    from rt.ray import session
    if rt.is_initialized():
        rt.finalize()
    others = []
    for path in glob.glob(os.path.join(cards.socket_dir, "torch-rank-*.pid")):
        try:
            with open(path) as f:
                pid = int(f.read())
        except (OSError, ValueError):
            continue
        if pid != os.getpid():
            others.append(pid)
    alive = _wait_gone(others, 2.0)                         # the usual case: they end with us
    if alive:
        print(f"npusim: rank 0 hosts this job's cards; waiting up to {EXIT_WAIT:g} s for the other ranks (pids "
              f"{sorted(alive)}) to exit before stopping them", flush=True)
        _wait_gone(alive, EXIT_WAIT)
    session.destroy_cards(cards)
    session.stop_ray()


def _wait_gone(pids, timeout: float) -> list[int]:
    """Wait until every process in ``pids`` has exited; returns the pids still running after ``timeout``.

    A process that exited counts as gone even while it is a zombie waiting for its parent's ``wait`` — a pidfd
    becomes readable at exit, not at reaping. That matters for ranks started by ``torch.multiprocessing``: the
    parent joins rank 0 first, so rank 1 stays a zombie until rank 0 (waiting here) is gone."""
    fds: dict[int, int] = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except OSError:
            continue                                        # already reaped
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout
    try:
        while fds:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for fd, _ in poller.poll(left * 1000):
                poller.unregister(fd)
                os.close(fd)
                fds.pop(fd)
    finally:
        for fd in fds:
            os.close(fd)
    return sorted(fds.values())
