"""Streams and events inside a card: ordered task queues, each run by its own worker thread.

The host holds handles (``rt.Stream``, ``rt.Event``, ``rt/host/streams.py``); what they name lives here:
a ``StreamQueue`` runs the stream's tasks, a ``CardEvent`` counts its records.

Everything is defined by two primitives: a stream runs its tasks strictly in enqueue order (one
worker thread per stream, so different streams overlap), and an event is a completion counter
(``record`` bumps the target generation at enqueue time, the stream reaching the record task
completes it). ``stream_wait_event``, synchronize markers and elapsed time are built on those.
"""

from __future__ import annotations

import collections
import threading
import time
import traceback
import warnings
from typing import Callable

from ..constants import AclErrorCode
from ..errors import AclError, NpuError

POLL = 0.5  # seconds between liveness checks of blocking waits inside the card
TASK_LOG = 2048  # finished tasks each stream remembers for the flight recorder and the timeline (trace_tasks)
_running = threading.local()  # the task this stream worker thread runs now (see running_task)


def annotate(**note) -> None:
    """Attach ``note`` (algorithm, step times, ...) to the task the calling stream thread runs: it appears in
    that task's entry of the stream's task log (``StreamQueue.log``). A no-op outside a stream thread."""
    current = getattr(_running, "note", None)
    if current is not None:
        current.update(note)


def current_note() -> dict:
    """The note of the task the calling stream thread runs (a throwaway dict outside a stream thread)."""
    note = getattr(_running, "note", None)
    return {} if note is None else note


def running_task():
    """``(owner, task label, card)`` of the task the calling thread runs, or None (not a stream worker)."""
    return getattr(_running, "task", None)


def forward_warnings() -> None:
    """Route Python warnings raised inside stream tasks (a user kernel's overflow, say) to the process that
    enqueued the task, which shows them as its own warnings naming the task and card — instead of the card
    process's stderr, where Ray would print them under its own banner. Installed once per card process."""
    if getattr(warnings.showwarning, "_npusim", False):
        return
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        task = running_task()
        if task is None or getattr(_running, "forwarding", False):
            return original(message, category, filename, lineno, file, line)
        owner, label, where = task
        _running.forwarding = True           # an in-process host re-raising it must not loop back here
        try:
            owner.send([0, "warning", [category.__name__, str(message), label.split("#")[0], where]])
        except Exception:  # noqa: BLE001 - the owner is gone: show it here
            original(message, category, filename, lineno, file, line)
        finally:
            _running.forwarding = False
    show._npusim = True
    warnings.showwarning = show


class Task:
    __slots__ = ("label", "fn", "host")

    def __init__(self, label: str, fn: Callable[[], None], host: bool = False):
        self.label = label
        self.fn = fn
        self.host = host        # enqueued by a host TASK message (counted in the shared stream state)


class StreamQueue:
    """A card-side stream: FIFO of tasks run by one worker thread; errors kept for the next sync."""

    def __init__(self, sid: int, owner, where: str):
        self.id = sid
        self.owner = owner
        self.where = where                  # "card 0 (node 0)" for messages
        self.enqueued = 0                   # tasks pushed
        self.completed = 0                  # tasks finished (ok or failed)
        self.errors: list[NpuError] = []
        self.closed = False
        self.draining = False               # destroyed: runs what it holds, takes nothing new
        self._drained: list[Callable[[], None]] = []
        self.host_done = 0                  # host-enqueued tasks finished
        self.state = None                   # [host_done, pending errors] in memory the host maps (or None)
        self.state_slot = -1
        self._tasks: collections.deque[Task] = collections.deque()
        # The task log: [label, host task index (0: not host-enqueued), start ns, end ns, ok, note, memory]
        # per finished task (monotonic clock, comparable across the processes of one machine); ``current`` is
        # the one running now. ``sampler()``, when set, is the card memory in use recorded at each task end.
        self.log: collections.deque = collections.deque(maxlen=TASK_LOG)
        self.current: list | None = None
        self.sampler = None
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"npu-stream-{sid}", daemon=True)
        self._thread.start()

    # -- producer side (the card's command dispatcher) ------------------------------------------
    def push(self, task: Task) -> int:
        """Enqueue; returns the task's 1-based sequence number on this stream."""
        with self._cv:
            if self.closed or self.draining:
                raise AclError(AclErrorCode.ACL_ERROR_RT_INVALID_HANDLE,
                               f"stream {self.id} on {self.where} is destroyed")
            self.enqueued += 1
            self._tasks.append(task)
            self._cv.notify()
            return self.enqueued

    def unshare_state(self) -> int:
        """Stop publishing (the stream is being destroyed); returns the slot it used (-1: none)."""
        with self._cv:
            slot, self.state, self.state_slot = self.state_slot, None, -1
            return slot

    def share_state(self, words) -> None:
        """Publish ``[host tasks finished, errors pending]`` into ``words`` (int64 ×2 the host maps), so the
        host can tell that this stream finished everything it enqueued without asking."""
        with self._cv:
            self.state = words
            words[1] = len(self.errors)
            words[0] = self.host_done

    def busy_until(self, seq: int) -> Callable[[], bool]:
        """A predicate that is True while task ``seq`` has not completed (used for deferred frees)."""
        return lambda: self.completed < seq and not self.closed

    def idle(self) -> bool:
        return self.completed >= self.enqueued

    def take_errors(self) -> NpuError | None:
        with self._cv:
            errs, self.errors = self.errors, []
            if self.state is not None:
                self.state[1] = 0
        if not errs:
            return None
        first = errs[0]
        if len(errs) == 1:
            return first
        more = "; ".join(e.message for e in errs[1:4])
        return type(first)(first.code, f"{first.message} (and {len(errs) - 1} more failed tasks: {more})")

    def wait_seq(self, seq: int, timeout: float | None) -> bool:
        """Block until task ``seq`` completed; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self.completed < seq and not self.closed:
                left = POLL if deadline is None else min(POLL, deadline - time.monotonic())
                if left <= 0:
                    return False
                self._cv.wait(left)
            return True

    def close(self, drain: bool = True, timeout: float = 30.0) -> None:
        """Stop the worker (after the queued tasks when ``drain``); then run the ``when_drained`` callbacks."""
        with self._cv:
            self.draining = True            # nothing new: the count below is final
        if drain:
            self.wait_seq(self.enqueued, timeout)
        with self._cv:
            self.closed = True
            self._tasks.clear()
            self._cv.notify_all()
            callbacks, self._drained = self._drained, []
        for cb in callbacks:
            cb()

    def when_drained(self, cb: Callable[[], None]) -> None:
        """Call ``cb`` once the stream has closed (now, if it has)."""
        with self._cv:
            if not self.closed:
                self._drained.append(cb)
                return
        cb()

    # -- the worker ---------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._tasks and not self.closed:
                    self._cv.wait()
                if self.closed:
                    return
                task = self._tasks.popleft()
            _running.task = (self.owner, task.label, self.where)
            note = _running.note = {}
            entry = self.current = [task.label, self.host_done + 1 if task.host else 0, time.monotonic_ns(), 0,
                                    True, note, 0]
            try:
                task.fn()
            except NpuError as e:
                entry[4] = False
                self._record(task, e)
            except Exception as e:  # a user kernel raising, or our bug: never kill the stream
                entry[4] = False
                tb = traceback.format_exception_only(type(e), e)[-1].strip()
                self._record(task, AclError(AclErrorCode.ACL_ERROR_RT_AICORE_EXCEPTION,
                                            f"task {task.label} on stream {self.id} of {self.where} failed: {tb}"))
            finally:
                _running.task = _running.note = None
            entry[3] = time.monotonic_ns()
            if self.sampler is not None:
                try:
                    entry[6] = self.sampler()
                except Exception:  # noqa: BLE001 - a closed card's memory: nothing to sample
                    pass
            self.log.append(entry)
            self.current = None
            with self._cv:
                self.completed += 1
                if task.host:
                    self.host_done += 1
                    if self.state is not None:      # errors first: the host reads done, then errors
                        self.state[1] = len(self.errors)
                        self.state[0] = self.host_done
                self._cv.notify_all()

    def task_log(self) -> list:
        """The finished tasks still remembered, then the running one (end 0), for ``trace_tasks``."""
        done = list(self.log)
        cur = self.current
        if cur is None:
            return done
        try:
            note = dict(cur[5])
        except RuntimeError:            # the task is annotating itself right now
            note = {}
        return done + [[*cur[:5], note, cur[6]]]

    def _record(self, task: Task, exc: NpuError) -> None:
        if f"stream {self.id}" not in exc.message:
            exc = type(exc)(exc.code, f"task {task.label} on stream {self.id} of {self.where} failed: {exc.message}")
        with self._cv:
            self.errors.append(exc)


class CardEvent:
    """A card-side event: generations recorded (at enqueue) and completed (when the stream gets there)."""

    def __init__(self, eid: int, owner):
        self.id = eid
        self.owner = owner
        self.recorded = 0          # generation of the latest record enqueued
        self.completed = 0         # generation of the latest record the stream reached
        self.timestamp_ns = None   # card clock when the latest record completed
        self._cv = threading.Condition()
        self._waiters: list[tuple[int, Callable[[], None]]] = []

    def mark_recorded(self, gen: int) -> None:
        """A record of generation ``gen`` was enqueued (generations are counted by the host)."""
        with self._cv:
            self.recorded = max(self.recorded, gen)

    def complete(self, gen: int) -> None:
        with self._cv:
            if gen > self.completed:
                self.completed = gen
                self.timestamp_ns = time.perf_counter_ns()
            ready = [cb for g, cb in self._waiters if g <= self.completed]
            self._waiters = [(g, cb) for g, cb in self._waiters if g > self.completed]
            self._cv.notify_all()
        for cb in ready:
            cb()

    def reset(self) -> None:
        with self._cv:
            self.recorded = self.completed = 0
            self.timestamp_ns = None

    def is_complete(self) -> bool:
        with self._cv:
            return self.recorded > 0 and self.completed >= self.recorded

    def on_complete(self, gen: int, cb: Callable[[], None]) -> None:
        """Call ``cb`` once generation ``gen`` completed (now, if it already has)."""
        with self._cv:
            if self.completed < gen:
                self._waiters.append((gen, cb))
                return
        cb()

    def wait(self, gen: int, timeout: float | None, alive: Callable[[], bool] = lambda: True) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self.completed < gen:
                if not alive():
                    return False
                left = POLL if deadline is None else min(POLL, deadline - time.monotonic())
                if left <= 0:
                    return False
                self._cv.wait(left)
            return True
