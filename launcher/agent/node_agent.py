"""Node agent: starts, watches and stops the rank processes of one node.

A plain class, so tests drive it in-process; ``launcher/launch/ray_backend.py`` wraps it as a Ray actor pinned to its
node. One long-lived I/O thread per agent does all the work that touches the processes: it forks them (so
``PR_SET_PDEATHSIG``, which fires when the *forking thread* exits, only fires when the agent itself
dies), reads their stdout/stderr pipes, and reaps them through pidfds — all in one ``selectors`` loop,
with no sleep-polling. Callers collect lines and exits with ``poll()`` (a long poll).

Orphans are impossible by construction: each rank runs in its own session (so a signal to its process
group reaches its children too), gets SIGKILL when the agent's process dies (PDEATHSIG), and the agent
kills every rank group it still owns when it shuts down or its interpreter exits.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import os
import queue
import selectors
import signal
import threading
import time

from . import ranks
from .ranks import STDERR, STDOUT, Rank, RankSpec

PAUSE_BYTES = 16 << 20      # stop reading pipes while this much output waits for poll() (backpressure)
POLL_BATCH_BYTES = 4 << 20  # most output bytes one poll() returns


class NodeAgent:
    """Starts and supervises the rank processes of one node (see the module docstring)."""

    def __init__(self, node_index: int = 0, notify=None):
        self.node_index = node_index
        self._notify = notify              # called (from the I/O thread) whenever poll() has news
        self._cond = threading.Condition()
        self._lines: list = []             # (rank, stream, text), in arrival order
        self._exits: list = []             # exit records, each after the last line of its rank
        self._pending_bytes = 0
        self._ranks: list[Rank] = []      # current attempt's ranks
        self._retired: list[Rank] = []    # earlier attempts' ranks whose pipes may still be open
        self._stopping = False
        self._paused = False
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._closed = False
        self._crashed: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=f"npusim-agent-{node_index}", daemon=True)
        self._thread.start()
        atexit.register(self.kill)

    # ---- API (any thread; also the Ray actor's methods) ----------------------------------------

    def ping(self) -> dict:
        """Liveness check; tells where the agent runs."""
        return {"pid": os.getpid(), "host": os.uname().nodename, "node_index": self.node_index}

    def start(self, specs: list[RankSpec], attempt: int = 0) -> list[int]:
        """Start the given ranks (fresh attempt) and return their pids."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._request(("start", specs, attempt, future))
        return future.result(timeout=120)

    def poll(self, timeout: float = 0.0) -> dict:
        """Wait up to timeout for news; return {'lines': [(rank, stream, text)], 'exits': [record]}."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._lines and not self._exits:
                self._check_crash()
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    break
                self._cond.wait(remaining)
            taken, nbytes = 0, 0
            while taken < len(self._lines) and nbytes < POLL_BATCH_BYTES:
                nbytes += len(self._lines[taken][2]) + 1
                taken += 1
            lines, self._lines = self._lines[:taken], self._lines[taken:]
            exits = []
            if not self._lines:  # an exit is reported only after every line its rank wrote
                exits, self._exits = self._exits, []
            self._pending_bytes -= nbytes
            resume = self._paused and self._pending_bytes < PAUSE_BYTES // 2
        if resume:
            self._request(("resume",))
        return {"node": self.node_index, "lines": lines, "exits": exits}

    def terminate(self) -> None:
        """SIGTERM every running rank's process group; exits from now on count as stopped, not failed."""
        with self._cond:
            self._stopping = True
            targets = [r for r in self._ranks if not r.reaped]
        for r in targets:
            self._killpg(r, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL every rank group still running or still holding our pipes (children of a rank)."""
        with self._cond:
            self._stopping = True
            targets = [r for r in self._ranks + self._retired if not r.reaped or r.open_fds]
        for r in targets:
            self._killpg(r, signal.SIGKILL)

    def wait_all(self, timeout: float) -> bool:
        """Wait until every rank of the current attempt has exited; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not all(r.reaped for r in self._ranks):
                self._check_crash()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def running(self) -> list[int]:
        """Ranks of the current attempt that have not exited."""
        with self._cond:
            return [r.spec.rank for r in self._ranks if not r.reaped]

    def shutdown(self) -> None:
        """Kill every rank, stop the I/O thread and release the agent's descriptors."""
        if self._closed:  # also after a crash of the I/O thread, which killed the ranks already
            return
        self.kill()
        self.wait_all(30.0)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._request(("close", future))
        future.result(timeout=30)
        self._thread.join(timeout=30)
        atexit.unregister(self.kill)

    def _check_crash(self) -> None:
        if self._crashed is not None:
            raise RuntimeError(f"node agent {self.node_index}: its I/O thread crashed "
                               f"({type(self._crashed).__name__}: {self._crashed}); its ranks were killed")

    # ---- the I/O thread ------------------------------------------------------------------------

    def _request(self, item) -> None:
        self._check_crash()
        self._requests.put(item)
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:  # the pipe is full of wake-ups already: the thread will see the item
            pass

    def _killpg(self, r: Rank, sig) -> None:
        try:
            os.killpg(r.proc.pid, sig)  # pgid == pid: each rank leads its own session
        except (ProcessLookupError, PermissionError):
            pass

    def _loop(self) -> None:
        try:
            while not self._closed:
                for key, _ in self._sel.select():
                    kind, obj = key.data
                    # An earlier event of the same batch may have consumed this one (a reap drains the
                    # rank's pipes to EOF), so check the fd or rank is still live before acting.
                    if kind == "wake":
                        self._handle_requests()
                    elif kind == "out" and key.fd in obj.open_fds:
                        self._read(obj, key.fd)
                    elif kind == "exit" and not obj.reaped:
                        self._reap(obj)
                self._apply_backpressure()
        except BaseException as e:  # never hang callers silently: poll()/wait_all() re-raise this
            with self._cond:
                self._crashed = e
                self._closed = True
                self._cond.notify_all()
            if self._notify:
                self._notify()
            self.kill()
            while not self._requests.empty():  # nobody will serve these now
                future = self._requests.get_nowait()[-1]
                if isinstance(future, concurrent.futures.Future):
                    future.set_exception(RuntimeError(f"node agent {self.node_index}: I/O thread crashed"))
            raise
        for key in list(self._sel.get_map().values()):
            self._sel.unregister(key.fd)
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _handle_requests(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                item = self._requests.get_nowait()
            except queue.Empty:
                return
            if item[0] == "start":
                self._start(*item[1:])
            elif item[0] == "exited":               # the fork server reaped one of our ranks
                r = next((r for r in self._ranks + self._retired if r.proc is item[1]), None)
                if r is not None and not r.reaped:
                    self._reap(r)
            elif item[0] == "resume":
                self._paused = False
                self._register_outputs()
            elif item[0] == "close":
                self._close_all_fds()
                self._closed = True
                with self._cond:
                    self._cond.notify_all()
                item[1].set_result(None)

    def _start(self, specs, attempt, future) -> None:
        with self._cond:
            self._retired = [r for r in self._retired + self._ranks if r.open_fds]
            self._ranks = []
            self._stopping = False
        pids = []
        try:
            for spec in specs:
                proc = ranks.start(spec, lambda p: self._request(("exited", p)))
                r = Rank(spec, attempt, proc)
                for fd in r.open_fds:
                    os.set_blocking(fd, False)
                if r.pidfd is not None:
                    self._sel.register(r.pidfd, selectors.EVENT_READ, ("exit", r))
                with self._cond:
                    self._ranks.append(r)
                pids.append(proc.pid)
            self._register_outputs()
        except BaseException as e:  # e.g. a bad cwd: the caller stops the ranks already started
            future.set_exception(e)
            return
        future.set_result(pids)

    def _register_outputs(self) -> None:
        if self._paused:
            return
        registered = self._sel.get_map()
        for r in self._ranks + self._retired:
            for fd in r.open_fds:
                if fd not in registered:
                    self._sel.register(fd, selectors.EVENT_READ, ("out", r))

    def _apply_backpressure(self) -> None:
        """With too much unread output, stop reading pipes: the ranks block on write until poll() drains."""
        if self._paused or self._pending_bytes < PAUSE_BYTES:
            return
        self._paused = True
        for r in self._ranks + self._retired:
            for fd in r.open_fds:
                if fd in self._sel.get_map():
                    self._sel.unregister(fd)

    def _read(self, r: Rank, fd: int) -> bool:
        """Read one chunk from a rank pipe; False when nothing more is available right now."""
        stream = r.open_fds[fd]
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return False
        if chunk:
            self._emit(r, stream, r.splitters[stream].feed(chunk))
            return True
        if fd in self._sel.get_map():
            self._sel.unregister(fd)
        del r.open_fds[fd]
        (r.proc.stdout if stream == STDOUT else r.proc.stderr).close()
        self._emit(r, stream, r.splitters[stream].flush())
        return False

    def _emit(self, r: Rank, stream: int, lines: list[str]) -> None:
        if not lines:
            return
        rank = r.spec.rank
        with self._cond:
            self._lines += [(rank, stream, text) for text in lines]
            self._pending_bytes += sum(len(text) + 1 for text in lines)
            if stream == STDERR:
                r.tail.extend(lines)
            self._cond.notify_all()
        if self._notify:
            self._notify()

    def _reap(self, r: Rank) -> None:
        # Everything the rank wrote before exiting is in its pipes now: take it before reporting the exit.
        for fd in list(r.open_fds):
            while fd in r.open_fds and self._read(r, fd):
                pass
        returncode = r.proc.wait()
        if r.pidfd is not None:
            self._sel.unregister(r.pidfd)
            os.close(r.pidfd)
        with self._cond:
            r.reaped = True
            self._exits.append({
                "rank": r.spec.rank, "local_rank": r.spec.local_rank, "node": self.node_index,
                "pid": r.proc.pid, "returncode": returncode, "time": time.time(), "attempt": r.attempt,
                "stopped": self._stopping, "stderr_tail": list(r.tail) if returncode else []})
            self._cond.notify_all()
        if self._notify:
            self._notify()

    def _close_all_fds(self) -> None:
        for r in self._ranks + self._retired:
            for fd in list(r.open_fds):
                if fd in self._sel.get_map():
                    self._sel.unregister(fd)
                (r.proc.stdout if r.open_fds.pop(fd) == STDOUT else r.proc.stderr).close()
            if not r.reaped and r.pidfd is not None:
                self._sel.unregister(r.pidfd)
                os.close(r.pidfd)
        self._retired = []
