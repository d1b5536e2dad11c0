"""The client end of one channel to a card (a host context's, or a peer card's): calls, tasks, notifications.

``call`` waits for the reply to its own request id (replies may arrive out of order: a stream
synchronize answers only when the stream gets there); ``submit`` never waits. Every wait has a
deadline or a liveness check, and a dead card turns into an ``AclError`` naming it.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Callable

from .. import errors
from ..constants import AclErrorCode as E
from ..errors import AclError
from . import extensions
from .protocol import CALL, NOTIFY, TASK
from .segment import close_fds, map_received

LIVENESS = 1.0   # seconds between checks that the card is still there while waiting
ERROR_HOOKS: list[Callable] = []   # fn(error) for every error a card answers (rt/diag/recorder.py adds one)


class _Waiter:
    __slots__ = ("event", "ok", "value", "fds")

    def __init__(self):
        self.event = threading.Event()
        self.ok = None
        self.value = None
        self.fds = ()


class CardClient:
    """A connection to one card; safe to use from several host threads."""

    def __init__(self, connect: Callable, *, name: str, label: str = "host", timeout: float | None = None):
        """``connect(on_message, on_close)`` returns a transport (``rt/wire/channel.py``); ``timeout``: seconds the
        card has to answer ``hello`` (None: as long as it lives). A ``hello`` that fails closes the channel."""
        self.name = name                      # "card 3 (node 0)" for messages
        self._ids = itertools.count(1)
        self._waiters: dict[int, _Waiter] = {}
        self._lock = threading.Lock()
        self.handlers: dict[str, Callable] = {}   # notification kind -> fn(payload)
        self.lost = False
        self._submitted: dict[int, int] = {}      # stream id -> tasks submitted to it
        self._retired: set[int] = set()           # destroyed stream ids (never reused by the card)
        self._order: dict[int, threading.RLock] = {}   # stream id -> held while a task is being placed
        self._state = None                        # int64 view of the card's shared stream-state page
        self._words = None                        # the same as a memoryview: a word read costs a tenth of numpy's
        self._slots: dict[int, int | None] = {}   # stream id -> slot in that page (None: not shared)
        self._announced = -1                      # extensions.version last declared to the card
        self._refused = None                      # (code, message) if the card refused this connection
        self._gone = threading.Event()            # set once the channel closed
        self.transport = connect(self._on_message, self._on_close)
        try:
            self.info = self.call("hello", os.getpid(), label, timeout=timeout)
        except BaseException:
            self.close()
            raise

    # -- incoming -------------------------------------------------------------------------------
    def _on_message(self, msg, fds=()) -> None:
        req = msg[0]
        if req == NOTIFY and msg[1] == "refused":   # the card did not admit us (wrong key): it closes next
            code, text = msg[2] if isinstance(msg[2], list) and len(msg[2]) == 2 else (None, msg[2])
            self._refused = (code if isinstance(code, int) else int(E.ACL_ERROR_RT_NO_PERMISSION), str(text))
            return
        if req == NOTIFY:
            handler = self.handlers.get(msg[1])
            try:
                if handler is not None:
                    handler(msg[2])
            except Exception as e:      # a host-side completion failed: report it, keep the channel
                errors.record_error_message(f"{self.name}: {msg[1]} notification failed: {type(e).__name__}: {e}")
            finally:
                for fd in fds:
                    os.close(fd)
            return
        with self._lock:
            w = self._waiters.pop(req, None)
        if w is None:                   # the caller gave up (timeout); drop the late reply
            for fd in fds:
                os.close(fd)
            return
        w.ok, w.value, w.fds = msg[1], msg[2], fds
        w.event.set()

    def _on_close(self) -> None:
        self.lost = True
        self._gone.set()
        with self._lock:
            waiters, self._waiters = list(self._waiters.values()), {}
        closed = self._refusal() or AclError(E.ACL_ERROR_RT_SOCKET_CLOSE, f"the channel to {self.name} closed (card "
                                                                          f"actor died or was shut down)")
        for w in waiters:
            w.ok, w.value = False, errors.to_wire(closed)
            w.event.set()

    def _refusal(self) -> AclError | None:
        """Why the card refused this connection (it presented no key, or another job's), if it did."""
        return None if self._refused is None else AclError(*self._refused)

    # -- outgoing -------------------------------------------------------------------------------
    def _send(self, msg, fds=()) -> None:
        if self.lost:
            raise self._refusal() or AclError(E.ACL_ERROR_RT_SOCKET_CLOSE, f"{self.name} is gone (its channel closed)")
        if self._announced != extensions.version:
            self._announce()
        try:
            self.transport.send(msg, fds)
        except OSError as e:
            if self._gone.wait(1.0) and self._refused is not None:   # the card refused us and closed: say why
                raise self._refusal() from None
            raise AclError(E.ACL_ERROR_RT_SOCKET_CLOSE, f"cannot reach {self.name}: {e}") from None
        except (TypeError, ValueError, OverflowError) as e:     # the wire encoder refused an argument
            raise AclError(E.ACL_ERROR_INVALID_PARAM,
                           f"{msg[2]}: an argument cannot be sent to {self.name} ({type(e).__name__}: {e})") from None

    def post(self, name: str, *args) -> None:
        """Run a command on the card without waiting for (or ever reading) its reply."""
        self._send([CALL, next(self._ids), name, list(args)])

    def _announce(self) -> None:
        """Declare this process's card extensions to the card before the command that may need them (the reply
        is not waited for: the channel is ordered)."""
        version, declared = extensions.version, extensions.declared()
        if declared:
            try:
                self.transport.send([CALL, next(self._ids), "extensions", [declared]], ())
            except OSError:
                return                  # the send that follows reports the lost channel
        self._announced = version

    def submit(self, stream_id: int, name: str, *args) -> int:
        """Enqueue a task on a card stream; returns at once (errors surface at the next synchronize) with the
        task's index among this client's tasks on that stream (what the card's task log calls it)."""
        with self.stream_order(stream_id):
            if stream_id in self._retired:
                raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE,
                               f"{name}: stream {stream_id} on {self.name} was destroyed (by another thread?)")
            n = self._submitted[stream_id] = self._submitted.get(stream_id, 0) + 1
            try:
                self._send([TASK, stream_id, name, list(args)])
            except BaseException:
                self._submitted[stream_id] -= 1
                raise
            return n

    def submitted(self, stream_id: int) -> int:
        return self._submitted.get(stream_id, 0)

    def stream_progress(self, stream_id: int) -> int | None:
        """Host tasks of the stream the card finished (from the shared page; None if it is not shared)."""
        slot = self._slots.get(stream_id)
        if slot is None or self._state is None or self.lost:
            return None
        return int(self._state[2 * slot])

    def retire_stream(self, stream_id: int) -> None:
        """Destroy ``stream_id`` on the card; enqueues racing with it from other threads fail at once (107017)
        instead of reaching a stream that no longer exists."""
        with self.stream_order(stream_id):
            self.call("stream_destroy", stream_id)
            self._retired.add(stream_id)

    # -- stream progress without a round trip -------------------------------------------------
    def stream_order(self, stream_id: int):
        """The lock that orders placing work on ``stream_id`` from several host threads: held by
        ``submit`` and by host fast paths that do a stream's work in this process."""
        lock = self._order.get(stream_id)
        if lock is None:
            with self._lock:
                lock = self._order.setdefault(stream_id, threading.RLock())
        return lock

    def stream_done(self, stream_id: int) -> bool:
        """True if the card finished every task this client submitted to the stream and holds no error
        for it — read from the stream-state page the card shares (one call per stream, the first time)."""
        slot = self._slots.get(stream_id, -1)
        if slot == -1:
            slot = self._share(stream_id)
        if slot is None or self.lost:
            return False
        words = self._words
        return words[2 * slot] == self._submitted.get(stream_id, 0) and words[2 * slot + 1] == 0

    def _share(self, stream_id: int) -> int | None:
        with self._lock:
            if stream_id in self._slots:
                return self._slots[stream_id]
        try:
            reply, fds = self.call("stream_share", stream_id, want_fds=True)
        except AclError:
            reply, fds = None, ()
        if reply is not None and self._state is None:       # the page's fd comes with the first reply
            try:
                self._state = map_received(fds, reply[1]).view("int64")
                self._words = memoryview(self._state).cast("B").cast("q")
            except OSError:
                reply = None
        else:
            close_fds(fds)
        slot = None if reply is None else reply[0]
        self._slots[stream_id] = slot
        return slot

    def call(self, name: str, *args, fds=(), timeout: float | None = None, pass_req: bool = False,
             timeout_error: Callable[[], AclError] | None = None, want_fds: bool = False):
        """Run a command on the card and wait for its reply (raising the card's error)."""
        req = next(self._ids)
        w = _Waiter()
        with self._lock:
            self._waiters[req] = w
        args = (*args, req) if pass_req else args
        try:
            self._send([CALL, req, name, list(args)], fds)
        except BaseException:
            with self._lock:
                self._waiters.pop(req, None)
            raise
        if not self._wait(w, timeout):
            with self._lock:
                self._waiters.pop(req, None)
            if timeout_error is not None:
                raise timeout_error()
            raise AclError(E.ACL_ERROR_RT_TIMEOUT, f"{name} on {self.name}: no reply within {timeout} s")
        if not w.ok:
            err = errors.from_wire(w.value)
            errors.record_error_message(err.message, module=err)
            for hook in ERROR_HOOKS:        # the flight recorder dumps on a collective's failure
                hook(err)
            raise err
        return (w.value, w.fds) if want_fds else w.value

    def _wait(self, w: _Waiter, timeout: float | None) -> bool:
        if timeout is not None:
            return w.event.wait(timeout)
        while not w.event.wait(LIVENESS):
            if self.lost:           # _on_close fills the waiter; this is only a belt for races
                return w.event.wait(0.1)
        return True

    def close(self) -> None:
        self._gone.set()                # a send after our own close fails at once (no wait for a refusal)
        self.transport.close()
        self._state = self._words = None    # unmaps the stream-state page (with the last view)
        self._slots.clear()
