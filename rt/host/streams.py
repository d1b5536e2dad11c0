"""Stream and event handles of the host (``rt.Stream``, ``rt.Event``), the calls on them, and host callbacks.

A handle names a queue or event counter on the card (``rt/card/queues.py``); ``None`` or ``0`` as a stream
is the current context's default stream. Enqueueing never waits; synchronize and query calls do. The
diagnostics see records, waits and synchronizes through the seam (``seam.py``).
"""

from __future__ import annotations

from .. import args
from ..constants import AclErrorCode as E
from ..diag import slog
from ..errors import AclError
from .runtime import RUNTIME, Context
from .seam import SEAM

DEFAULT_WAIT = 1836.0        # seconds, when the config gives no exec_timeout (CANN's default)


def _wait_timeout() -> float:
    """Seconds a stream task may wait for another (an event of another stream, a blocking callback): the config's
    ``exec_timeout``, the execution timeout the tasks of every package share."""
    return float(getattr(RUNTIME.cfg, "exec_timeout", DEFAULT_WAIT)) if RUNTIME.cfg else DEFAULT_WAIT


class Stream:
    """A stream handle; ``None`` or ``0`` in any call means the current context's default stream."""

    def __init__(self, ctx: Context, sid: int):
        self.ctx = ctx
        self.id = sid
        self.destroyed = False

    def __repr__(self):
        return f"Stream({self.id} on {self.ctx.name}{', destroyed' if self.destroyed else ''})"


def stream_handle(stream, call) -> Stream:
    if type(stream) is Stream and not stream.destroyed and not stream.ctx.destroyed:
        return stream                   # the common case, first: a live stream (``_live`` says why another is not)
    if stream is None or (isinstance(stream, int) and not isinstance(stream, bool) and stream == 0):
        ctx = RUNTIME.require_current(call)
        if ctx.default_stream is None:
            ctx.default_stream = Stream(ctx, 0)
        return ctx.default_stream
    return _live(stream, Stream, call, "a stream (use rt.create_stream())")


def current_stream(stream, call) -> Stream:
    """``stream_handle`` for work enqueued on behalf of the current context: a stream of another card would
    run it on the wrong card, so CANN refuses it (107003, "stream not in current context")."""
    st = stream_handle(stream, call)
    cur = RUNTIME.current
    if cur is not None and (st.ctx.node, st.ctx.physical) != (cur.node, cur.physical):
        raise AclError(E.ACL_ERROR_RT_STREAM_CONTEXT, f"{call}: {st!r} is not on the current context's card "
                                                      f"({cur.name}); use a stream created on this card")
    return st


def _live(handle, cls, call, what):
    """``handle`` if it is a ``cls`` that is not destroyed (nor its context); else the ACL error."""
    if not isinstance(handle, cls):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {args.shown(handle)} is not {what}")
    if handle.destroyed or handle.ctx.destroyed:
        raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE, f"{call}: {args.shown(handle)} was destroyed")
    return handle


def create_stream() -> Stream:
    ctx = RUNTIME.require_current("create_stream")
    st = Stream(ctx, ctx.client.call("stream_create"))
    slog.info(slog.RUNTIME, "stream %d created on %s", st.id, ctx.name)
    return st


def destroy_stream(stream: Stream) -> None:
    """Destroy a stream; work already queued on it still runs."""
    st = stream_handle(stream, "destroy_stream")
    if st.id == 0:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, "destroy_stream: the default stream cannot be destroyed")
    st.ctx.client.retire_stream(st.id)
    st.destroyed = True
    slog.info(slog.RUNTIME, "stream %d destroyed on %s", st.id, st.ctx.name)


def synchronize_stream(stream=None) -> None:
    """Wait for all work on the stream; raises the first async failure of that work."""
    st = None
    if stream is None and RUNTIME.initialized:
        # the step of every loop: the current context's default stream, without stream_handle's general lookup
        # (each Python call a small collective makes costs 1-3 % of it with 8 ranks on 2 cores: docs/performance.md)
        ctx = getattr(RUNTIME.tls, "ctx", None)
        if ctx is not None and not ctx.destroyed:
            st = ctx.default_stream
    if st is None:
        st = stream_handle(stream, "synchronize_stream")
    if SEAM.syncs:
        SEAM.synchronizing(st.ctx, "synchronize_stream")
    ctx = st.ctx
    # Done if the card finished all of it without errors and every copy into host memory landed (no round trip)
    if ctx.notify or not ctx.client.stream_done(st.id):
        _traced_wait("synchronize_stream", st, lambda: ctx.client.call("stream_sync", st.id, pass_req=True))
    if SEAM.syncs:
        SEAM.synchronized_stream(st, "synchronize_stream")


def _traced_wait(op: str, st: Stream, wait, **fields) -> None:
    """Run a blocking wait, shown to the observers (the flight recorder: who waited where, how long, how it
    ended)."""
    token = SEAM.waiting(op, st, fields) if SEAM.on else None
    if token is None:
        return wait()
    try:
        wait()
    except BaseException as e:
        SEAM.waited(token, e)
        raise
    SEAM.waited(token)


def synchronize_stream_with_timeout(stream, timeout_ms: int) -> None:
    """As synchronize_stream, but raises 507046 after ``timeout_ms`` (-1: no limit, 0: check now)."""
    st = stream_handle(stream, "synchronize_stream_with_timeout")
    if not args.is_int(timeout_ms) or not -1 <= timeout_ms < 1 << 31:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"synchronize_stream_with_timeout: timeout "
                                                  f"{args.shown(timeout_ms)} must be "
                                                  f"-1, 0 or a positive number of milliseconds")
    if timeout_ms == -1:
        return synchronize_stream(st)

    def expired():
        return AclError(E.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                        f"synchronize_stream_with_timeout: {st!r} still busy after {timeout_ms} ms")
    if timeout_ms == 0:
        if stream_query(st) != 0:
            raise expired()
        return synchronize_stream(st)
    if SEAM.syncs:
        SEAM.synchronizing(st.ctx, "synchronize_stream_with_timeout")
    _traced_wait("synchronize_stream_with_timeout", st, lambda: st.ctx.client.call(
        "stream_sync", st.id, pass_req=True, timeout=timeout_ms / 1000, timeout_error=expired), timeout_ms=timeout_ms)
    if SEAM.syncs:
        SEAM.synchronized_stream(st, "synchronize_stream_with_timeout")


def stream_query(stream=None) -> int:
    """ACL_STREAM_STATUS_COMPLETE (0) when all its work is done, else NOT_READY (1)."""
    st = stream_handle(stream, "stream_query")
    status = st.ctx.client.call("stream_query", st.id)
    if status == 0 and SEAM.syncs:
        SEAM.synchronized_stream(st, None)      # the host saw it finish: as good as a synchronize
    return status


def synchronize_device() -> None:
    """Wait for all streams of the current context; raises the first async failure."""
    ctx = RUNTIME.require_current("synchronize_device")
    if SEAM.syncs:
        SEAM.synchronizing(ctx, "synchronize_device")
    st = stream_handle(None, "synchronize_device")     # make sure the default stream exists on the card
    ctx.client.call("default_stream")
    _traced_wait("synchronize_device", st, lambda: ctx.client.call("device_sync", pass_req=True))
    if SEAM.syncs:
        SEAM.synchronized_device(ctx, "synchronize_device")


def stream_wait_event(stream, event) -> None:
    """Make ``stream`` wait (on the card) for ``event``'s latest record — also one of another card."""
    st = stream_handle(stream, "stream_wait_event")
    ev = _event(event, "stream_wait_event")
    task = st.ctx.client.submit(st.id, "wait_event", [ev.ctx.node, ev.ctx.physical], ev.id, ev.gen, _wait_timeout())
    if SEAM.on:
        SEAM.event_waited(st, ev, task)


# ====================================================================== events
class Event:
    def __init__(self, ctx: Context, eid: int):
        self.ctx = ctx
        self.id = eid
        self.gen = 0                 # records issued from this host (the card completes them in order)
        self.destroyed = False

    def __repr__(self):
        return f"Event({self.id} on {self.ctx.name})"


def _event(event, call) -> Event:
    return _live(event, Event, call, "an event (use rt.create_event())")


def create_event() -> Event:
    ctx = RUNTIME.require_current("create_event")
    return Event(ctx, ctx.client.call("event_create"))


def destroy_event(event: Event) -> None:
    ev = _event(event, "destroy_event")
    ev.ctx.client.call("event_destroy", ev.id)
    ev.destroyed = True


def record_event(event: Event, stream=None) -> None:
    ev = _event(event, "record_event")
    st = stream_handle(stream, "record_event")
    if st.ctx.client is not ev.ctx.client and (st.ctx.node, st.ctx.physical) != (ev.ctx.node, ev.ctx.physical):
        raise AclError(E.ACL_ERROR_RT_STREAM_CONTEXT,
                       f"record_event: {ev!r} and {st!r} are on different cards")
    ev.gen += 1
    task = st.ctx.client.submit(st.id, "record", ev.id, ev.gen)
    if SEAM.on:
        SEAM.event_recorded(st, ev, task)


def reset_event(event: Event, stream=None) -> None:
    ev = _event(event, "reset_event")
    st = stream_handle(stream, "reset_event")
    ev.gen = 0
    st.ctx.client.submit(st.id, "reset_event", ev.id)


def query_event_status(event: Event) -> int:
    """ACL_EVENT_RECORDED_STATUS_COMPLETE (1) once the latest record completed, else NOT_READY (0)."""
    ev = _event(event, "query_event_status")
    status = ev.ctx.client.call("event_query", ev.id)
    if status == 1 and SEAM.syncs:
        SEAM.synchronized_event(ev, None)
    return status


def synchronize_event(event: Event) -> None:
    ev = _event(event, "synchronize_event")
    if SEAM.syncs:
        SEAM.synchronizing(ev.ctx, "synchronize_event")
    if ev.gen:
        st = stream_handle(None, "synchronize_event") if RUNTIME.current is ev.ctx else None
        if st is None:
            ev.ctx.client.call("event_sync", ev.id, ev.gen, pass_req=True)
        else:
            _traced_wait("synchronize_event", st, lambda: ev.ctx.client.call("event_sync", ev.id, ev.gen,
                                                                             pass_req=True), event=ev.id, gen=ev.gen)
    if SEAM.syncs:
        SEAM.synchronized_event(ev, "synchronize_event")


def event_elapsed_time(start: Event, end: Event) -> float:
    """Milliseconds between two completed records, measured on the card."""
    a, b = _event(start, "event_elapsed_time"), _event(end, "event_elapsed_time")
    if (a.ctx.node, a.ctx.physical) != (b.ctx.node, b.ctx.physical):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, "event_elapsed_time: the events are on different cards")
    return a.ctx.client.call("event_elapsed", a.id, b.id)


# ====================================================================== callbacks
def launch_callback(fn, user_data=None, block=True, stream=None) -> None:
    """Run ``fn(user_data)`` on a host thread of this process once prior work on the stream is done;
    a blocking callback holds the stream until it returns."""
    if not callable(fn):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"launch_callback: fn {args.shown(fn)} is not callable")
    block = args.flag(block, "launch_callback", "block")
    st = current_stream(stream, "launch_callback")
    cb = st.ctx.add_callback(fn, user_data)
    st.ctx.client.submit(st.id, "callback", cb, block, _wait_timeout())
