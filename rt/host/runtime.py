"""Process-wide runtime state: where the cards are, visible devices, contexts and the thread's current one.

A *context* is one channel to one card (``CardClient``); everything created through it (memory,
streams, events, models) belongs to it on the card and is released when it is destroyed. ``set_device``
uses a per-process, reference-counted default context per device and binds it to the calling thread.
A context also runs what the card asks of this process: host work in stream order (``run_after``), user
callbacks (on a thread of the context), and warnings raised by tasks on the card.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import itertools
import os
import queue
import sys
import threading
import traceback
import warnings

from .. import args, errors
from ..config import Config, load_config
from ..constants import AclErrorCode as E
from ..diag import slog
from ..errors import AclError
from ..wire.client import CardClient
from . import backends
from .hostmem import PINNED
from .hostview import DeviceMap

_tokens = itertools.count(1)


class Context:
    """A context on one card: the channel plus host-side bookkeeping (staging buffers, callbacks)."""

    def __init__(self, device: int, physical: int, node: int, client: CardClient, default: bool):
        self.device = device          # logical (visible) index
        self.physical = physical      # card index on the node
        self.node = node
        self.client = client
        self.default = default
        self.destroyed = False
        self.registered: set[int] = set()      # HostBuffer ids mapped on the card
        self.callbacks: dict[int, tuple] = {}
        self.notify: dict[int, object] = {}    # token -> closure run when the card reaches it
        self.lock = threading.Lock()
        self.devmap = DeviceMap(client)        # our allocations, viewable from this process
        self.callback_jobs: queue.SimpleQueue = queue.SimpleQueue()   # None ends the worker
        self._warned: dict = {}                # warnings registry: each distinct warning once, as Python's default
        self.staging = None                    # pinned buffers for large pageable copies (rt/host/copies.py)
        self.default_stream = None             # the Stream handle of id 0 (rt/host/streams.py)
        self.kernels: set[str] = set()         # @rt.kernel names registered on the card

    @property
    def name(self) -> str:
        return f"device {self.device} (card {self.physical}, node {self.node})"

    def check(self) -> None:
        if self.destroyed:
            raise AclError(E.ACL_ERROR_RT_CONTEXT_NULL, f"context of {self.name} was destroyed")

    def __repr__(self) -> str:
        return f"Context({self.name}{', default' if self.default else ''})"

    def run_after(self, stream_id: int, fn) -> None:
        """Run ``fn`` on the host once the card has reached this point of the stream (before later replies)."""
        token = next(_tokens)
        self.notify[token] = fn
        self.client.submit(stream_id, "notify", token)

    def add_callback(self, fn, user_data) -> int:
        """Register a user callback; the card names it by the returned id when it is due."""
        cb = next(_tokens)
        self.callbacks[cb] = (fn, user_data)
        return cb

    def wire(self) -> None:
        """Handle the card's notifications: stream-ordered host work, callbacks, warnings."""
        self.client.handlers["notify"] = self._on_notify
        self.client.handlers["callback"] = self.callback_jobs.put
        self.client.handlers["warning"] = self._on_warning
        threading.Thread(target=self._callback_worker, name="npu-callbacks", daemon=True).start()

    def _on_notify(self, token) -> None:
        fn = self.notify.get(token)
        if fn is not None:
            try:
                fn()
            finally:                    # only now: synchronize_stream's fast check looks at ctx.notify
                self.notify.pop(token, None)

    def _callback_worker(self) -> None:
        RUNTIME.set_current(self)       # so a callback can call rt (memcpy, record_event...) on its context
        while True:
            cb_id = self.callback_jobs.get()
            if cb_id is None:
                return
            fn, data = self.callbacks.pop(cb_id, (None, None))
            failure = None
            try:
                if fn is not None:
                    fn(data)
            except errors.NpuError as e:             # an ACL failure fails a blocking callback's stream task
                failure = errors.to_wire(e)
            except Exception:
                text = traceback.format_exc()
                errors.record_error_message(f"launch_callback: {fn!r} raised:\n{text}")
                print(f"npusim: host callback {fn!r} raised:\n{text}", file=sys.stderr)
            finally:
                if not self.client.lost and not self.destroyed:
                    try:
                        self.client.post("callback_done", cb_id, failure)
                    except AclError:
                        pass

    def _on_warning(self, payload) -> None:
        category, text, task, where = payload
        cls = getattr(builtins, category, None)
        if not (isinstance(cls, type) and issubclass(cls, Warning)):
            cls = RuntimeWarning
        warnings.warn_explicit(f"{text} (in a {task} task)", cls, f"<{where}>", 0, module="npusim.card",
                               registry=self._warned)


class Runtime:
    """What ``rt.init`` sets up: a backend that opens channels to cards, and the visible devices."""

    def __init__(self):
        self.lock = threading.RLock()
        self.initialized = False
        self.cfg: Config | None = None
        self.backend = None
        self.visible: list[int] = []
        self.node = 0
        self.refcount: dict[int, int] = {}
        self.defaults: dict[int, Context] = {}
        self.contexts: set[Context] = set()
        self.tls = threading.local()
        self.exited = False             # finalized by finalize_at_exit: the process is exiting

    # -- init / finalize ----------------------------------------------------------------------
    def init(self, config=None, *, address=None, backend=None) -> None:
        with self.lock:
            if self.initialized:
                raise AclError(E.ACL_ERROR_REPEAT_INITIALIZE, "init: the runtime is already initialized in this process")
            self.cfg = load_config(config)
            self.visible = parse_visible(os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), self.cfg.cards_per_node)
            self.backend = choose_backend(self.cfg, self.visible, address=address, backend=backend)
            if self.backend.kind == "ray":
                atexit.register(finalize_at_exit)   # atexit is LIFO: release our cards before Ray's own shutdown
            self.node = self.backend.node
            PINNED.limit = self.cfg.pinned_limit_bytes
            self.initialized = True
            self.exited = False

    def finalize(self) -> None:
        with self.lock:
            if not self.initialized:
                raise AclError(E.ACL_ERROR_REPEAT_FINALIZE, "finalize: the runtime is not initialized")
            for ctx in list(self.contexts):
                self.destroy(ctx)
            self.refcount.clear()
            self.defaults.clear()
            self.backend.close()
            self.backend = None
            self.initialized = False
        self.tls = threading.local()

    def require(self) -> None:
        if not self.initialized:
            raise AclError(E.ACL_ERROR_UNINITIALIZE, "the runtime is not initialized: call rt.init() first")

    # -- devices -------------------------------------------------------------------------------
    def physical(self, device: int) -> int:
        self.require()
        if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < len(self.visible):
            vis = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
            extra = f" (ASCEND_RT_VISIBLE_DEVICES={vis!r})" if vis is not None else ""
            raise AclError(E.ACL_ERROR_RT_INVALID_DEVICEID,
                           f"invalid device id {args.shown(device)}: this process sees {len(self.visible)} device(s), "
                           f"valid ids are 0..{len(self.visible) - 1}{extra}")
        return self.visible[device]

    def open(self, device: int, default: bool) -> Context:
        phys = self.physical(device)
        name = f"card {phys} (node {self.node})"
        client = CardClient(lambda on_msg, on_close: self.backend.connect(phys, on_msg, on_close), name=name)
        ctx = Context(device, phys, self.node, client, default)
        ctx.wire()
        self.contexts.add(ctx)
        slog.info(slog.RUNTIME, "context created on %s%s", ctx.name, " (the device's default)" if default else "")
        return ctx

    def destroy(self, ctx: Context) -> None:
        if ctx.destroyed:
            return
        for hook in RELEASE_HOOKS:      # the timeline collects the card's task log before it goes
            hook(ctx.client)
        try:
            if not ctx.client.lost:
                ctx.client.call("release", timeout=60)
        except AclError:
            pass
        ctx.destroyed = True
        ctx.client.close()
        ctx.devmap.close()
        if ctx.staging is not None:
            ctx.staging.release()
        ctx.callback_jobs.put(None)     # stop the context's callback thread (it would wait forever)
        self.contexts.discard(ctx)
        slog.info(slog.RUNTIME, "context destroyed on %s", ctx.name)

    # -- the calling thread's current context ----------------------------------------------------
    @property
    def current(self) -> Context | None:
        ctx = getattr(self.tls, "ctx", None)
        return None if ctx is None or ctx.destroyed else ctx

    def set_current(self, ctx: Context | None) -> None:
        self.tls.ctx = ctx

    @contextlib.contextmanager
    def using(self, ctx: Context):
        """Make ``ctx`` the calling thread's current context for a moment (one process may drive several cards)."""
        prev = self.current
        self.set_current(ctx)
        try:
            yield ctx
        finally:
            self.set_current(prev)

    def require_current(self, call: str) -> Context:
        self.require()
        ctx = self.current
        if ctx is None:
            raise AclError(E.ACL_ERROR_RT_CONTEXT_NULL,
                           f"{call}: no current device in this thread (call rt.set_device(i) first)")
        return ctx


RUNTIME = Runtime()
RELEASE_HOOKS: list = []       # fn(client) before a context's card connection is released (rt/diag/recorder.py)


def choose_backend(cfg: Config, visible: list[int], *, address=None, backend=None):
    """Where the cards live (``rt/host/backends.py``): ``backend`` or NPUSIM_BACKEND, else the launcher's socket
    directory, else Ray."""
    chosen = backend
    backend = backend or os.environ.get("NPUSIM_BACKEND")
    card_dir = os.environ.get("NPUSIM_CARD_DIR")
    world = _world_size()
    if backend == "local" and chosen is None and card_dir and world > 1:
        # a rank of a launched job whose environment still says "local": cards of its own would never meet the
        # other ranks' in a collective (comm init would time out after HCCL_CONNECT_TIMEOUT naming them)
        raise AclError(E.ACL_ERROR_INVALID_PARAM,
                       f"init: NPUSIM_BACKEND=local gives this process cards of its own, but it is rank "
                       f"{os.environ.get('RANK', '?')} of a launched job of {world} ranks whose cards "
                       f"serve in {card_dir} (NPUSIM_CARD_DIR): its collectives could never meet the other "
                       f"ranks'; unset NPUSIM_BACKEND to use the job's cards")
    if backend == "local":
        return backends.LocalCards(cfg)
    if card_dir and not address and backend in (None, "socket"):
        return backends.SocketDirCards(cfg, card_dir, int(os.environ.get("NPUSIM_NODE", "0")))
    if backend not in (None, "ray", "socket"):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"init: unknown backend {backend!r} (expected 'ray' or 'local')")
    from ..ray.backend import RayCards          # imports Ray: only when cards live in a Ray session
    return RayCards(cfg, visible, address or os.environ.get("RAY_ADDRESS"))


def _world_size() -> int:
    """WORLD_SIZE as ``launch`` sets it (1 when absent or not a number)."""
    text = os.environ.get("WORLD_SIZE", "1")
    return int(text) if text.isdigit() else 1


def parse_visible(text: str | None, count: int) -> list[int]:
    """ASCEND_RT_VISIBLE_DEVICES as CANN reads it: ascending ids, parsing stops at the first bad entry."""
    if text is None:
        return list(range(count))
    if text.strip() in ("", "NoDevFiles"):
        return []
    out: list[int] = []
    for part in text.split(","):
        if not part.isdigit():          # " 2" or "x": CANN stops here
            break
        dev = int(part)
        if dev >= count or (out and dev <= out[-1]):
            break
        out.append(dev)
    return out


@atexit.register
def finalize_at_exit() -> None:
    """The process is exiting with the runtime still up: release its cards before Ray's own shutdown. Objects a
    program releases later, in ``__del__`` at interpreter shutdown (acllite's way), are gone with it already:
    ``exited`` lets the ``acl`` facade report those releases as done (on CANN they run before the runtime goes)."""
    if RUNTIME.initialized:
        try:
            RUNTIME.finalize()
        except Exception:
            pass
        RUNTIME.exited = True
