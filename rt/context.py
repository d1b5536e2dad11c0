"""Process-wide runtime state: the backend, visible devices, contexts and the thread's current one.

A *context* is one channel to one card (``CardClient``); everything created through it (memory,
streams, events, models) belongs to it on the card and is released when it is destroyed. ``set_device``
uses a per-process, reference-counted default context per device and binds it to the calling thread.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading

from .client import CardClient
from .config import Config, load_config
from .constants import AclErrorCode as E
from .errors import AclError
from .hostmem import PINNED
from .hostview import DeviceMap


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

    @property
    def name(self) -> str:
        return f"device {self.device} (card {self.physical}, node {self.node})"

    def check(self) -> None:
        if self.destroyed:
            raise AclError(E.ACL_ERROR_RT_CONTEXT_NULL, f"context of {self.name} was destroyed")

    def __repr__(self) -> str:
        return f"Context({self.name}{', default' if self.default else ''})"


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

    # -- init / finalize ----------------------------------------------------------------------
    def init(self, config=None, *, address=None, backend=None) -> None:
        from . import backends
        with self.lock:
            if self.initialized:
                raise AclError(E.ACL_ERROR_REPEAT_INITIALIZE, "init: the runtime is already initialized in this process")
            self.cfg = load_config(config)
            self.backend = backends.choose(self.cfg, address=address, backend=backend)
            self.node = self.backend.node
            self.visible = parse_visible(os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), self.cfg.cards_per_node)
            PINNED.limit = self.cfg.pinned_limit_bytes
            self.initialized = True

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
                           f"invalid device id {device!r}: this process sees {len(self.visible)} device(s), "
                           f"valid ids are 0..{len(self.visible) - 1}{extra}")
        return self.visible[device]

    def open(self, device: int, default: bool) -> Context:
        phys = self.physical(device)
        name = f"card {phys} (node {self.node})"
        client = CardClient(lambda on_msg, on_close: self.backend.connect(phys, on_msg, on_close), name=name)
        ctx = Context(device, phys, self.node, client, default)
        from . import api
        api._install_handlers(ctx)
        self.contexts.add(ctx)
        return ctx

    def destroy(self, ctx: Context) -> None:
        if ctx.destroyed:
            return
        try:
            if not ctx.client.lost:
                ctx.client.call("release", timeout=60)
        except AclError:
            pass
        ctx.destroyed = True
        ctx.client.close()
        ctx.devmap.close()
        staging = getattr(ctx, "staging", None)
        if staging is not None:
            staging.release()
        jobs = getattr(ctx, "callback_jobs", None)
        if jobs is not None:
            jobs.put(None)              # stop the context's callback thread (it would wait forever)
        self.contexts.discard(ctx)

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
def _finalize_at_exit() -> None:
    if RUNTIME.initialized:
        try:
            RUNTIME.finalize()
        except Exception:
            pass
