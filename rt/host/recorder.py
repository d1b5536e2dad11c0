"""The flight recorder: a bounded ring of what this process asked its cards to do, dumped when a run goes wrong.

Always on (``NPUSIM_TRACE_BUFFER_SIZE`` entries, default 2000; 0 turns it off). Every collective and p2p call
(communicator, sequence number, op, dtype, count, root, reduction, requested algorithm, stream, the host call
site), every stream synchronize and event record/wait/synchronize is one entry with its enqueue time; the
card keeps a log of the tasks each stream ran (start, end, success, the algorithm it picked and the end of
each of its steps: ``rt/card/queues.py``), and a dump joins the two, so each entry says whether it was
enqueued, started, completed or failed, and when.

A dump is one JSON file per rank, ``<dir>/trace_rank<N>.json`` (``NPUSIM_TRACE_DUMP_DIR``; ``launch`` sets it to
``--log-dir`` or a directory of its own), written automatically when a card reports a failure (a collective
timeout, mismatch, dead peer, any failed task), on an uncaught exception, on SIGTERM (the launcher stopping
the job after another rank failed) and on SIGUSR1; on demand with :func:`dump`. ``python -m hccl.trace DIR``
reads every rank's dump and says what went wrong.

With ``NPUSIM_PROFILE_DIR`` set (``launch --profile FILE``) the ring and the card logs hold everything and the
process writes ``<dir>/profile_rank<N>.json`` at exit, which ``launcher/profile.py`` turns into one timeline.

Clocks: every time is ``time.monotonic_ns()``, which is one clock for every process of a machine (host and
card alike); ``wall_offset_ns`` converts to Unix time.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback

from .. import args, callsite
from ..errors import HcclError, NpuError
from ..wire import client as wire_client

DEFAULT_SIZE = 2000
PROFILE_SIZE = 1 << 20          # entries kept (host ring and each card stream's log) when profiling
CARD_QUERY_TIMEOUT = 2.0        # seconds a dump waits for a card's task log
FORMAT = 1

# Frames in these directories are npusim's own (torch's is added once torch is imported): the call site is the
# first frame outside them (rt/callsite.py).
_INTERNAL = callsite.PACKAGE_DIRS


_STDLIB = os.path.dirname(os.__file__) + os.sep


def _size() -> int:
    if os.environ.get("NPUSIM_PROFILE_DIR"):
        return PROFILE_SIZE
    text = os.environ.get("NPUSIM_TRACE_BUFFER_SIZE", str(DEFAULT_SIZE))
    try:
        return max(0, int(text))
    except ValueError:
        return DEFAULT_SIZE


class Recorder:
    """This process's ring (``RECORDER``). ``record_*`` are called by rt and hccl on every traced call."""

    def __init__(self, size: int | None = None):
        # Configured from the environment at the first recorded call, not at import: a rank forked from a
        # pre-imported server (launcher/forkserver.py) gets its environment after this module loaded.
        self._fixed_size = size
        self.configured = False
        self.enabled = True
        self.size = DEFAULT_SIZE
        self.entries: collections.deque = collections.deque(maxlen=DEFAULT_SIZE)
        self.profile_dir: str | None = None
        self.clients: dict[int, object] = {}          # id(client) -> client, every card this process used
        self.saved_logs: dict[str, list] = {}         # card name -> task log fetched before its release
        self.reasons: list[str] = []
        self.exception: str | None = None
        self.rank: int | None = None
        self._ids = itertools.count(1)
        self.last_id = 0
        self._hooked = False
        self._lock = threading.Lock()
        self._internal = _INTERNAL
        if "torch" in sys.modules:
            self._add_torch()

    def _add_torch(self) -> None:
        torch_dir = os.path.dirname(getattr(sys.modules["torch"], "__file__", "") or "")
        if torch_dir and torch_dir + os.sep not in self._internal:
            self._internal = (*self._internal, torch_dir + os.sep)

    # -- recording (hot path: keep it lean) --------------------------------------------------------
    def site(self, depth: int = 5):
        """The innermost frame outside npusim (and torch) — the user's call — and the user frame that called it
        (a helper's caller is usually the line a user looks for): ``(code, line, code, line)``, formatted only
        when dumped (:func:`site_text`). ``depth`` is where the user's frame is when the public function was
        called directly (site, _entry, the recorder's method, the internal caller, the public function): going
        there in one step materialises one frame object instead of every one on the way, which is most of the
        recorder's cost per call; a deeper call (a wrapper, torch) is walked out from there."""
        try:
            f = sys._getframe(depth)
        except ValueError:
            f = sys._getframe(3)
        internal = self._internal
        f = callsite.outside(f, internal)
        if f is None:
            return None
        up = f.f_back
        if up is not None and not up.f_code.co_filename.startswith(internal):
            return (f.f_code, f.f_lineno, up.f_code, up.f_lineno)
        return (f.f_code, f.f_lineno, None, 0)

    def main_stack(self) -> list[str]:
        """Where the main thread is now (its innermost user frames, outermost first): what a rank was doing."""
        frame = sys._current_frames().get(threading.main_thread().ident)
        out = []
        while frame is not None and len(out) < 40:
            name = frame.f_code.co_filename
            if not name.startswith(self._internal) and name[0] != "<" and not name.startswith(_STDLIB) \
                    and "/launcher/" not in name:
                out.append(f"{name}:{frame.f_lineno} in {frame.f_code.co_name}")
            frame = frame.f_back
        return out[:4][::-1]

    def configure(self) -> None:
        self.size = _size() if self._fixed_size is None else self._fixed_size
        self.profile_dir = os.environ.get("NPUSIM_PROFILE_DIR") or None
        self.entries = collections.deque(self.entries, maxlen=max(self.size, 1))
        self.enabled = self.size > 0
        self.configured = True

    def _client(self, client) -> None:
        key = id(client)
        if key not in self.clients:
            self.clients[key] = client
            if "torch" in sys.modules:
                self._add_torch()
            if not self._hooked:
                self._install()
            if self.profile_dir:
                try:
                    client.call("trace_config", PROFILE_SIZE, True, timeout=CARD_QUERY_TIMEOUT)
                except NpuError:
                    pass

    def record(self, kind: str, op: str, client, stream_id: int, task: int | None, depth: int = 5,
               **fields) -> dict | None:
        """One entry; ``task`` is the stream task index the card's log will know it by (None: done here);
        ``depth``: see :meth:`site`."""
        e = self._entry(kind, op, client, stream_id, task, depth)
        if e is not None and fields:
            e.update(fields)
        return e

    def _entry(self, kind, op, client, stream_id, task, depth: int = 5) -> dict | None:
        if not self.configured:
            self.configure()
        if not self.enabled:
            return None
        if id(client) not in self.clients:
            self._client(client)
        self.last_id = n = next(self._ids)
        e = {"id": n, "kind": kind, "op": op, "client": client, "stream": stream_id, "task": task,
             "site": self.site(depth), "t_enq": time.monotonic_ns()}
        self.entries.append(e)
        return e

    def collective(self, comm, op: str, params: dict, seq: int, stream) -> dict | None:
        """A collective as it is called (state "in the call" until :meth:`placed`). Kept cheap: the call's
        parameters are referenced, not copied, and expanded only when dumped."""
        e = self._entry("collective", op, stream.ctx.client, stream.id, None)
        if e is not None:
            e["comm_obj"], e["p"], e["seq"], e["placed"] = comm, params, seq, False
            if self.rank is None:
                self.rank = comm.rank
        return e

    @staticmethod
    def placed(entry: dict, task: int | None, on_host: bool = False) -> None:
        """The call returned: it went to stream task ``task``, or ran to completion in this process."""
        entry["placed"] = True
        if on_host:
            entry["state"], entry["t_end"], entry["algo_used"] = "completed", time.monotonic_ns(), "staged (host path)"
        else:
            entry["task"] = task

    def begin(self, op: str, client, stream_id: int, **fields) -> dict | None:
        """A blocking host call (a synchronize): ``end(entry)`` when it returns."""
        return self.record("wait", op, client, stream_id, None, depth=6, target=client.submitted(stream_id), **fields)

    @staticmethod
    def end(entry: dict | None, error: BaseException | None = None) -> None:
        if entry is not None:
            entry["t_end"] = time.monotonic_ns()
            if error is not None:
                entry["error"] = str(getattr(error, "message", error))

    # -- dumps ------------------------------------------------------------------------------------
    def directory(self) -> str | None:
        return os.environ.get("NPUSIM_TRACE_DUMP_DIR") or None

    def rank_label(self) -> str:
        rank = os.environ.get("RANK")
        if rank is None and self.rank is not None:
            rank = str(self.rank)
        return rank if rank is not None else f"pid{os.getpid()}"

    def card_logs(self) -> dict:
        """``{card name: [card clock then, {sid: task log}]}`` of every card this process used: asked now, or, for
        a card that is gone or does not answer within CARD_QUERY_TIMEOUT, as an earlier dump or the context's
        release last saw it (a SIGTERM after the process released its cards must not lose what they said)."""
        for client in list(self.clients.values()):
            if getattr(client, "lost", True):
                continue
            try:
                self._merge(client.name, client.call("trace_tasks", timeout=CARD_QUERY_TIMEOUT))
            except Exception:  # noqa: BLE001 - a dump never fails because a card is gone or busy
                pass
        return dict(self.saved_logs)

    def _merge(self, card: str, answer) -> None:
        """Streams released since the last answer (the context went) keep what they last said."""
        now, per_stream = answer
        old = self.saved_logs.get(card)
        self.saved_logs[card] = [now, {**(old[1] if old else {}), **per_stream}]

    def save_logs(self, client) -> None:
        """Before a context goes: keep its card's task log (when dumps or profiles may still want it). A later
        dump does not ask the closed channel again (each try would wait for a card that cannot answer)."""
        known = self.clients.pop(id(client), None) is not None     # released: later dumps use what is saved
        if not known or client.lost or not (self.profile_dir or self.directory()):
            return
        try:
            self._merge(client.name, client.call("trace_tasks", timeout=CARD_QUERY_TIMEOUT))
        except Exception:  # noqa: BLE001
            pass

    def snapshot(self, reason: str) -> dict:
        entries = [_expand(e) for e in list(self.entries)]
        logs = self.card_logs()
        progress = {}
        for client in list(self.clients.values()):
            for sid in list(getattr(client, "_submitted", {})):
                progress[f"{client.name}/{sid}"] = [client.submitted(sid), client.stream_progress(sid)]
        tasks = {}
        for card, (_, per_stream) in logs.items():
            for sid, log in per_stream.items():
                for t in log:
                    if t[1]:
                        tasks[(card, int(sid), t[1])] = t
        for e in entries:
            if e.get("placed") is False:
                e["state"] = "in the call"      # the host was still inside it (waiting for peers)
                continue
            if e["task"] is None or e.get("state"):
                continue
            t = tasks.get((e["card"], e["stream"], e["task"]))
            if t is not None:
                e["t_start"] = t[2]
                if t[3]:
                    e["t_end"] = t[3]
                    e["state"] = "completed" if t[4] else "failed"
                else:
                    e["state"] = "started"
                note = t[5] or {}
                if "algo" in note:
                    e["algo_used"] = note["algo"]
                continue
            submitted, done = progress.get(f"{e['card']}/{e['stream']}", [None, None])
            if done is not None and done >= e["task"]:
                e["state"] = "finished"          # the card got past it; whether it failed, its log no longer says
            else:
                e["state"] = "enqueued" if e["card"] in logs else "not completed"
        return {"format": FORMAT, "rank": self.rank_label(), "pid": os.getpid(), "host": socket.gethostname(),
                "argv": sys.argv, "reasons": self.reasons + [reason], "exception": self.exception,
                "main_stack": self.main_stack(),
                "now_ns": time.monotonic_ns(), "wall_offset_ns": time.time_ns() - time.monotonic_ns(),
                "buffer_size": self.size, "dropped": max(0, self.last_id - len(entries)),
                "entries": entries, "cards": logs, "streams": progress}

    def dump(self, reason: str = "on demand", path: str | None = None) -> str | None:
        """Write this rank's dump (to ``path``, else the dump directory, else nothing); returns the path."""
        with self._lock:
            if path is None:
                where = self.directory()
                if where is None:
                    return None
                path = os.path.join(where, f"trace_rank{self.rank_label()}.json")
            data = self.snapshot(reason)
            self.reasons.append(reason)
            return _write(path, data)

    def write_profile(self) -> str | None:
        if not self.profile_dir or not self.clients:
            return None
        with self._lock:
            data = self.snapshot("profile")
            return _write(os.path.join(self.profile_dir, f"profile_rank{self.rank_label()}.json"), data)

    # -- automatic dumps --------------------------------------------------------------------------
    def _install(self) -> None:
        """Dump on failures, uncaught exceptions, SIGTERM and SIGUSR1 (handlers only where none is set)."""
        self._hooked = True
        wire_client.ERROR_HOOKS.append(self._on_card_error)
        from . import runtime
        runtime.RELEASE_HOOKS.append(self.save_logs)
        if self.profile_dir:
            atexit.register(self.write_profile)
        previous = sys.excepthook

        def excepthook(tp, value, tb):
            if tp is not KeyboardInterrupt or self.directory():
                self.exception = "".join(traceback.format_exception(tp, value, tb))[-8000:]
                self._dump_quietly(f"uncaught {tp.__name__}: {value}")
            previous(tp, value, tb)
        sys.excepthook = excepthook
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGUSR1):
            try:
                if signal.getsignal(signum) in (signal.SIG_DFL, None):
                    signal.signal(signum, self._on_signal)
            except (ValueError, OSError):
                pass

    def _on_card_error(self, err) -> None:
        if isinstance(err, HcclError) and self.directory():
            self._dump_quietly(f"{type(err).__name__} [{err.code}]: {err.message[:300]}")

    def _dump_quietly(self, reason: str) -> None:
        """A dump from a signal handler or hook: in a thread (the interrupted code may hold a client lock),
        waited for a bounded time, never raising."""
        if not self.directory():
            return
        done = threading.Event()

        def run():
            try:
                self.dump(reason)
            except Exception as e:  # noqa: BLE001 - diagnosing must never break the program
                print(f"npusim: flight recorder dump failed: {type(e).__name__}: {e}", file=sys.stderr)
            finally:
                done.set()
        threading.Thread(target=run, name="npusim-trace-dump", daemon=True).start()
        done.wait(CARD_QUERY_TIMEOUT * 2 + 1)

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        self._dump_quietly(f"{name} received")
        if signum == signal.SIGTERM:
            if self.profile_dir:
                self.write_profile()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


def site_text(site) -> str:
    """"/path/common.py:17 < /path/train.py:40" of a :meth:`Recorder.site` tuple."""
    if site is None:
        return "?"
    code, line, up, up_line = site
    here = f"{code.co_filename}:{line}"
    return f"{here} < {up.co_filename}:{up_line}" if up is not None and up.co_filename[0] != "<" else here


def _expand(e: dict) -> dict:
    """A ring entry as the dump shows it (plain JSON values)."""
    out = dict(e)
    out["card"] = getattr(out.pop("client"), "name", "?")
    out["site"] = site_text(e.get("site"))
    comm, params = out.pop("comm_obj", None), out.pop("p", None)
    if comm is not None:
        out.update(comm=comm.id, rank=comm.rank, size=comm.size)
    if params is not None:
        out.update(dtype=params.get("dtype"), count=params.get("count"), root=params.get("root"),
                   reduce=params.get("op"), algo=params.get("algo") or "", fingerprint=params.get("fingerprint"))
    return out


def _write(path: str, data: dict) -> str | None:
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, default=str)
        os.replace(tmp, path)
        return path
    except OSError as e:
        print(f"npusim: cannot write the flight recorder dump {path}: {e}", file=sys.stderr)
        return None


RECORDER = Recorder()


def dump(path: str | None = None, reason: str = "on demand") -> str | None:
    """Write this process's flight-recorder dump now: to ``path``, else ``NPUSIM_TRACE_DUMP_DIR``/
    ``trace_rank<N>.json``, else ``./trace_rank<N>.json``. Returns the file written."""
    from ..constants import AclErrorCode as E
    from ..errors import AclError
    if path is not None:
        if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)) or "\0" in os.fspath(path):
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"trace_dump: path {args.shown(path)} is not a file path")
        path = os.fspath(path)
    elif RECORDER.directory() is None:
        path = os.path.join(os.getcwd(), f"trace_rank{RECORDER.rank_label()}.json")
    if not isinstance(reason, str):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"trace_dump: reason {args.shown(reason)} is not a str")
    written = RECORDER.dump(reason, path)
    if written is None:
        raise AclError(E.ACL_ERROR_WRITE_FILE, f"trace_dump: cannot write {path or RECORDER.directory()} "
                                               f"(see the message above)")
    return written
