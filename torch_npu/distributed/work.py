"""Asynchronous ``Work`` for the ``"hccl"`` process group, and the executors that run it in order.

Each process group runs its collectives on one executor — a thread bound to the group's card with a stream
of its own — so ``async_op=True`` really overlaps with the caller (DDP's reducer launches bucket all-reduces
during backward and waits later) and collectives stay in issue order, as every rank must issue them.
Point-to-point operations get an executor per peer and direction: a rank may post ``isend`` to a peer and
``irecv`` from it in either order without deadlock, as with gloo.
"""

from __future__ import annotations

import datetime
import queue
import threading

import torch
import torch.distributed as dist

import rt

from .errors import backend_error


class Work(dist.Work):
    """One collective: ``wait()`` blocks until it finished (raising its error), ``is_completed()`` does not."""

    def __init__(self, pg, op: str, seq: int, result: list, timeout: float):
        super().__init__()
        self.pg, self.op, self.seq, self._result, self._timeout = pg, op, seq, result, timeout
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._future = torch.futures.Future()

    def finish(self, error: BaseException | None = None) -> None:
        self._error = error
        self._done.set()
        if error is None:
            self._future.set_result(self._result)
        else:
            self._future.set_exception(error)

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self):
        return self._error

    def result(self) -> list:
        self.wait()
        return self._result

    def source_rank(self) -> int:
        raise RuntimeError("source_rank: recv from any source is not supported by the hccl backend")

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout or 0)
        # The group's timeout is HCCL's execution timeout too, and HCCL's own error names the missing ranks:
        # the default wait leaves it the time to arrive first and is only the backstop.
        limit = seconds if seconds > 0 else self._timeout + max(5.0, 0.1 * self._timeout)
        if not self._done.wait(limit):
            raise dist.DistBackendError(
                f"[Rank {self.pg.rank()}] hccl: {self.op} (#{self.seq} of process group '{self.pg.group_tag}') did "
                f"not complete within {limit:g} s; it is still waiting for its peers — see their output for the "
                f"rank that never called it")
        if self._error is not None:
            raise self._error
        return True

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        return self._future

    def __repr__(self) -> str:
        state = "done" if self.is_completed() else "pending"
        return f"Work(hccl {self.op} #{self.seq}, {state})"


class Executor:
    """A thread with the group's card current and a stream of its own, running closures in order."""

    def __init__(self, ctx, name: str):
        self.ctx = ctx
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.stream = None
        self.buffers: dict[str, tuple[int, int]] = {}       # scratch device buffers by role: (ptr, capacity)
        self.idle = threading.Event()
        self.idle.set()
        self._pending = 0
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = threading.Event()
        self.thread.start()
        self._started.wait()

    def submit(self, work: Work, fn) -> Work:
        with self._lock:
            self._pending += 1
            self.idle.clear()
        self.jobs.put((work, fn))
        return work

    def buffer(self, role: str, nbytes: int) -> int:
        """A device buffer of at least ``nbytes`` for ``role`` (reused; grown by powers of two)."""
        ptr, cap = self.buffers.get(role, (0, 0))
        if nbytes <= cap:
            return ptr
        if ptr:
            rt.free(ptr)
        cap = max(4096, 1 << (max(nbytes, 1) - 1).bit_length())
        ptr = rt.malloc(cap)
        self.buffers[role] = (ptr, cap)
        return ptr

    def _run(self) -> None:
        torch.set_grad_enabled(False)       # c10d writes results under autograd's radar, as the C++ backends do
        rt.set_context(self.ctx)
        self.stream = rt.create_stream()
        self._started.set()
        while True:
            item = self.jobs.get()
            if item is None:
                break
            work, fn = item
            try:
                fn(self)
                error = None
            except BaseException as e:  # noqa: BLE001 - becomes the Work's error, raised by wait()
                error = backend_error(work, e)
            work.finish(error)
            with self._lock:
                self._pending -= 1
                if not self._pending:
                    self.idle.set()
        self._release()

    def _release(self) -> None:
        try:
            for ptr, _ in self.buffers.values():
                rt.free(ptr)
            rt.destroy_stream(self.stream)
        except rt.NpuError:
            pass                                  # the card is gone already (its error was reported)
        self.buffers.clear()

    def drain(self, timeout: float) -> bool:
        return self.idle.wait(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        self.jobs.put(None)
        self.thread.join(timeout)
