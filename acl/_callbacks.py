"""pyACL's callback model: a thread the program owns subscribes to streams and runs their callbacks.

``util.start_thread(fn, args)`` starts the thread; ``rt.subscribe_report(tid, stream)`` ties a stream to it;
the thread loops over ``rt.process_report(timeout_ms)``, which runs the callbacks that became due, on that
thread, with whatever context the thread set; ``rt.launch_callback(fn, user_data, block, stream)`` queues
one once the stream's prior work is done — a blocking callback holds its stream until the subscribed thread
has run it.
"""

from __future__ import annotations

import queue
import threading

import rt
from rt import args, errors
from rt.constants import AclErrorCode as E
from rt.diag import slog
from rt.errors import AclError
from rt.host.runtime import RUNTIME

from ._core import code, log, report, stream_of

_DEFAULT_EXEC_TIMEOUT = 1836.0


class _Subscriptions:
    """pyACL's callback model: a program thread subscribes to streams and runs their callbacks in
    ``process_report``; a blocking callback holds its stream until that thread has run it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.thread_of: dict[object, int] = {}             # key(rt Stream) -> thread id
        self.queues: dict[int, queue.SimpleQueue] = {}     # thread id -> callbacks due

    @staticmethod
    def key(st):
        """A stream's key: the rt Stream, or for the default stream (None) the current context's — a subscription
        to one context's default stream is not one to every other context's (nor a later runtime's)."""
        return st if st is not None else ("default stream", RUNTIME.current)

    def subscribe(self, tid, st, call) -> None:
        st = self.key(st)
        with self.lock:
            if self.thread_of.get(st) is not None:
                raise AclError(E.ACL_ERROR_RT_STREAM_SUBSCRIBE, f"{call}: the stream is already subscribed by thread "
                                                             f"{self.thread_of[st]}")
            self.thread_of[st] = tid
            self.queues.setdefault(tid, queue.SimpleQueue())

    def unsubscribe(self, tid, st, call) -> None:
        st = self.key(st)
        with self.lock:
            if self.thread_of.get(st) != tid:
                raise AclError(E.ACL_ERROR_RT_STREAM_SUBSCRIBE, f"{call}: thread {tid} is not subscribed to the stream")
            del self.thread_of[st]

    def adopt(self, tid: int) -> None:
        """A thread util.start_thread made: its process_report waits quietly until it is subscribed (the
        samples start the report loop before they subscribe)."""
        with self.lock:
            self.queues.setdefault(tid, queue.SimpleQueue())

    def queue_for(self, st):
        st = self.key(st)
        with self.lock:
            tid = self.thread_of.get(st)
            return (None, None) if tid is None else (tid, self.queues[tid])

    def my_queue(self, call):
        with self.lock:
            q = self.queues.get(threading.get_native_id())
        if q is None:
            raise AclError(E.ACL_ERROR_RT_THREAD_SUBSCRIBE, f"{call}: thread {threading.get_native_id()} is "
                                                             f"subscribed to no stream (acl.rt.subscribe_report)")
        return q


SUBSCRIPTIONS = _Subscriptions()


def _thread_id(thread_id, call: str) -> int:
    """A native thread id: a C uint64_t."""
    return args.integer(thread_id, call, "thread id", hi=(1 << 64) - 1)


@code("rt.subscribe_report")
def subscribe_report(thread_id, stream):
    call = "rt.subscribe_report"
    SUBSCRIPTIONS.subscribe(_thread_id(thread_id, call), stream_of(stream, call), call)


@code("rt.unsubscribe_report")
def unsubscribe_report(thread_id, stream):
    call = "rt.unsubscribe_report"
    SUBSCRIPTIONS.unsubscribe(_thread_id(thread_id, call), stream_of(stream, call), call)


def process_report(timeout):
    """Run the callbacks due on the streams this thread subscribed to; wait up to ``timeout`` ms (-1: for ever)
    for the first one. Returns 0, or ACL_ERROR_RT_REPORT_TIMEOUT (507012) when none came (routine in a program's
    polling loop: not logged); a thread subscribed to nothing gets ACL_ERROR_RT_THREAD_SUBSCRIBE (107012). These
    are the codes CANN's runtime returns (its docs deprecate 100036 and 100035 for them). A callback that raises is reported with its traceback (logger npusim.acl and
    get_recent_err_msg) and the others still run: the stream does not fail for it, as on CANN."""
    try:
        q = _report_queue(timeout)
        item = q.get(timeout=None if timeout == -1 else timeout / 1000)
    except queue.Empty:
        return int(E.ACL_ERROR_RT_REPORT_TIMEOUT)
    except Exception as e:  # noqa: BLE001 - pyACL returns codes
        return report("rt.process_report", e)
    while item is not None:
        _run(item)
        try:
            item = q.get_nowait()
        except queue.Empty:
            item = None
    return 0


def _report_queue(timeout):
    if not args.is_int(timeout) or not (timeout == -1 or 0 < timeout < 1 << 31):    # CANN: -1 or > 0 (int32)
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"rt.process_report: timeout {args.shown(timeout)} must be -1 or "
                                                  f"a number of milliseconds from 1 to 2**31 - 1")
    return SUBSCRIPTIONS.my_queue("rt.process_report")


def _run(item) -> None:
    fn, user_data, done = item
    try:
        fn(user_data)
    except Exception as e:  # noqa: BLE001 - the program's callback: report it, keep serving the others
        name = getattr(fn, "__qualname__", repr(fn))
        errors.record_error_message(f"rt.process_report: callback {name}({user_data!r}) raised "
                                    f"{type(e).__name__}: {e}", module=slog.ASCENDCL)
        log.error("acl.rt.process_report: callback %s raised", name, exc_info=True)
    finally:
        done.set()


@code("rt.launch_callback")
def launch_callback(fn, user_data, block_type, stream):
    """``fn(user_data)`` once the stream's prior work is done, on the thread subscribed to the stream (pyACL);
    a stream nobody subscribed to is ACL_ERROR_RT_STREAM_NO_CB_REG (107015), as CANN's runtime refuses it."""
    if not callable(fn):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"rt.launch_callback: fn {args.shown(fn)} is not callable")
    block = args.flag(block_type, "rt.launch_callback", "block_type")
    st = stream_of(stream, "rt.launch_callback")
    tid, q = SUBSCRIPTIONS.queue_for(st)
    if q is None:
        raise AclError(E.ACL_ERROR_RT_STREAM_NO_CB_REG, "rt.launch_callback: no thread subscribed to the stream: "
                                                        "call acl.rt.subscribe_report(thread_id, stream) first")
    timeout = float(RUNTIME.cfg.exec_timeout) if RUNTIME.cfg else _DEFAULT_EXEC_TIMEOUT

    def due(_):
        done = threading.Event()
        q.put((fn, user_data, done))
        if block:                                      # the stream waits for the subscribed thread
            _await_thread(done, tid, timeout)
    rt.launch_callback(due, None, True, st)


def _await_thread(done: threading.Event, tid: int, timeout: float) -> None:
    """Wait for thread ``tid`` to run a blocking callback: an error, not a hang, if it ends without doing so
    or does not get to it within ``timeout`` seconds (the config's exec_timeout)."""
    waited = 0.0
    while not done.wait(min(1.0, timeout - waited)):
        waited += 1.0
        if not any(t.native_id == tid for t in threading.enumerate()):
            raise AclError(E.ACL_ERROR_RT_REPORT_TIMEOUT, f"rt.launch_callback: thread {tid}, subscribed to the "
                                                          f"stream, ended without running the blocking callback")
        if waited >= timeout:
            raise AclError(E.ACL_ERROR_RT_REPORT_TIMEOUT, f"rt.launch_callback: thread {tid}, subscribed to the "
                                                          f"stream, did not call process_report within "
                                                          f"{timeout:g} s to run the blocking callback")
