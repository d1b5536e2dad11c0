"""The flight recorder: a bounded ring of what this process asked its cards to do, dumped when a run goes wrong.

Always on (``NPUSIM_TRACE_BUFFER_SIZE`` entries, default 2000; 0 turns it off). Every collective and p2p call
(communicator, sequence number, its package's fields — HCCL's op, dtype, count, root, reduction, requested
algorithm — stream, the host call site), every stream synchronize and event record/wait/synchronize is one entry
with its enqueue time; the card keeps a log of the tasks each stream ran (start, end, success, the algorithm it
picked and the end of each of its steps: ``rt/card/queues.py``), and a dump joins the two, so each entry says
whether it was enqueued, started, completed or failed, and when. It observes the host through the seam
(``rt/host/seam.py``).

A dump is one JSON file per rank, ``<dir>/trace_rank<N>.json`` (``NPUSIM_TRACE_DUMP_DIR``; ``launch`` sets it to
``--log-dir`` or a directory of its own), written automatically when a card reports a failure of a job-wide
kind (a collective timeout, mismatch, dead peer, any failed collective task), on an uncaught exception, on
SIGTERM (the launcher stopping the job after another rank failed) and on SIGUSR1; on demand with :func:`dump`.
``python -m hccl.trace DIR`` reads every rank's dump and says what went wrong. Dumps: ``rt/diag/dumps.py``.

With ``NPUSIM_PROFILE_DIR`` set (``launch --profile FILE``) the ring and the card logs hold everything and the
process writes ``<dir>/profile_rank<N>.json`` at exit, which the launcher's profile merge turns into one timeline.

Clocks: every time is ``time.monotonic_ns()``, which is one clock for every process of a machine (host and
card alike); ``wall_offset_ns`` converts to Unix time.
"""

from __future__ import annotations

import collections
import itertools
import os
import sys
import threading
import time

from .. import args
from ..constants import AclErrorCode as E
from ..errors import AclError, NpuError
from ..host.seam import SEAM, Observer
from . import callsite, dumps

DEFAULT_SIZE = 2000
PROFILE_SIZE = 1 << 20          # entries kept (host ring and each card stream's log) when profiling

# Frames in these directories are npusim's own (torch's is added once torch is imported): the call site is the
# first frame outside them (rt/diag/callsite.py).
# A worker thread's stack ends in threading's bootstrap: counting it as npusim's own lets the walk out of a
# worker's frames end (None), where the site its submitter captured takes over (``Recorder.on_behalf``).
_INTERNAL = (*callsite.PACKAGE_DIRS, threading.__file__)
_STDLIB = os.path.dirname(os.__file__) + os.sep
_HOST_DONE = dumps.HOST_DONE
_now = time.monotonic_ns
_getframe = sys._getframe


class _Files(dict):
    """Whether a file is npusim's own (or torch's), by its name: under one of ``dirs``. Each name is classified on
    its first read; the names are few (a code object's ``co_filename``; every ``exec`` shares ``"<string>"``),
    and the dict starts afresh past ``MAX`` all the same."""

    MAX = 8192

    def __init__(self, dirs: tuple):
        super().__init__()
        self.dirs = dirs

    def __missing__(self, name: str) -> bool:
        if len(self) >= self.MAX:
            self.clear()
        own = self[name] = name.startswith(self.dirs)
        return own


def _size() -> int:
    if os.environ.get("NPUSIM_PROFILE_DIR"):
        return PROFILE_SIZE
    text = os.environ.get("NPUSIM_TRACE_BUFFER_SIZE", str(DEFAULT_SIZE))
    try:
        return max(0, int(text))
    except ValueError:
        return DEFAULT_SIZE


class Recorder(Observer):
    """This process's ring (``RECORDER``): the seam's events it watches become entries."""

    order = 1                  # after the race detector, before fault injection: a rank a fault stops is seen
                               # in the call

    def __init__(self, size: int | None = None):
        # Configured from the environment at the first recorded call, not at import: a rank forked from a
        # pre-imported server (launcher/forkserver/) gets its environment after this module loaded.
        self._fixed_size = size
        self.configured = False
        self.watching = True
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
        self._own = _Files(_INTERNAL)                 # file name -> whether it is npusim's own: site()
        self._last_client = None                      # the card of the last collective (set up: _first_call)
        self._handed = threading.local()              # .site: a submitter's call site, on a worker thread
        if "torch" in sys.modules:
            self.add_torch()

    def add_torch(self) -> None:
        """Count torch's frames as not the user's (torch_npu calls it at import; the first card seen does too)."""
        torch_dir = os.path.dirname(getattr(sys.modules["torch"], "__file__", "") or "")
        if torch_dir and torch_dir + os.sep not in self._own.dirs:
            self._own = _Files((*self._own.dirs, torch_dir + os.sep))

    # -- recording (hot path: keep it lean) --------------------------------------------------------
    def site(self, depth: int = 5):
        """The innermost frame outside npusim (and torch) — the user's call — and the user frame that called it
        (a helper's caller is usually the line a user looks for): ``(code, offset, code, offset)``, the offsets
        those frames' last instructions (``f_lasti``), turned into lines only when dumped
        (:func:`dumps.site_text`: a frame's ``f_lineno`` searches its code's line table on every read).
        ``depth`` is where the user's frame is when the public function was called directly and the seam called
        the recorder directly (site, _entry, the recorder's handler, the internal caller, the public function):
        going there in one step materialises one frame object instead of every one on the way; a deeper call
        (the seam's loop when several observers watch, a wrapper, torch) is walked out from there. Whether a
        frame is npusim's own is looked up by its file name (``_Files``: one dict read a frame; a code object's
        own hash digests its whole body)."""
        try:
            f = _getframe(depth)
        except ValueError:                  # called near the top of a thread's stack
            f = _getframe(1)
        own = self._own
        code = f.f_code
        while own[code.co_filename]:
            f = f.f_back
            if f is None:               # a worker thread's stack: the site of the call it runs, if handed over
                return getattr(self._handed, "site", None)
            code = f.f_code
        up = f.f_back
        if up is not None:
            up_code = up.f_code
            if not own[up_code.co_filename]:
                return (code, f.f_lasti, up_code, up.f_lasti)
        return (code, f.f_lasti, None, 0)

    def on_behalf(self, site, fn, *args):
        """``fn(*args)`` on a worker thread for a call made at ``site`` (``site(1)`` in the calling thread): what
        the recorder records in it names the user's line, not the worker's (torch_npu's process groups run their
        collectives on such threads)."""
        handed = self._handed
        handed.site = site
        try:
            return fn(*args)
        finally:
            handed.site = None

    def main_stack(self) -> list[str]:
        """Where the main thread is now (its innermost user frames, outermost first): what a rank was doing."""
        frame = sys._current_frames().get(threading.main_thread().ident)
        out = []
        skip = (*self._own.dirs, _STDLIB, *callsite.TOOL_DIRS)
        while frame is not None and len(out) < 40:
            name = frame.f_code.co_filename
            if not name.startswith(skip) and name[0] != "<":
                out.append(f"{name}:{frame.f_lineno} in {frame.f_code.co_name}")
            frame = frame.f_back
        return out[:4][::-1]

    def configure(self) -> None:
        self.size = _size() if self._fixed_size is None else self._fixed_size
        self.profile_dir = os.environ.get("NPUSIM_PROFILE_DIR") or None
        self.entries = collections.deque(self.entries, maxlen=max(self.size, 1))
        self.watching = self.size > 0
        self.configured = True
        SEAM.refresh()

    def _client(self, client) -> None:
        key = id(client)
        if key not in self.clients:
            self.clients[key] = client
            if "torch" in sys.modules:
                self.add_torch()
            if not self._hooked:
                self._hooked = True
                dumps.install(self)
            if self.profile_dir:
                try:
                    client.call("trace_config", PROFILE_SIZE, True, timeout=dumps.CARD_QUERY_TIMEOUT)
                except NpuError:
                    pass

    def _entry(self, kind, op, client, stream_id, task, depth: int = 5) -> dict | None:
        if not self.configured:
            self.configure()
        if not self.watching:
            return None
        if id(client) not in self.clients:
            self._client(client)
        self.last_id = n = next(self._ids)
        e = {"id": n, "kind": kind, "op": op, "client": client, "stream": stream_id, "task": task,
             "site": self.site(depth), "t_enq": time.monotonic_ns()}
        self.entries.append(e)
        return e

    # -- the seam's events --------------------------------------------------------------------------
    def collective(self, st, kind, label, seq, group, params, buffers, calls) -> list | None:
        """A collective as it is called (state "in the call" until :meth:`placed`). Kept cheap (the hot path of
        every collective): the entry is a list (``dumps.CALL_SLOTS``; a dict costs six times as much to build and
        to free), the call's parameters are referenced, not copied, and expanded by its package
        (``calls.fields``) only when dumped."""
        client = st.ctx.client
        if client is not self._last_client and not self._first_call(client, group):
            return None
        self.last_id = n = next(self._ids)
        e = [n, kind, label, client, st.id, None, self.site(4), _now(), group, params, buffers, calls, seq, False, 0]
        self.entries.append(e)
        return e

    def _first_call(self, client, group) -> bool:
        """What :meth:`collective` sets up once per card (the first call, and again when a call goes to another
        card than the last): the configuration, the client, the rank; False: the recorder is off."""
        if not self.configured:
            self.configure()
            if not self.watching:
                return False
        if id(client) not in self.clients:
            self._client(client)
        if self.rank is None:
            self.rank = group.rank
        self._last_client = client
        return True

    @staticmethod
    def placed(entry: list, task: int | None, on_host: bool = False) -> None:
        """The call returned: it went to stream task ``task``, or ran to completion in this process."""
        if on_host:
            entry[13], entry[14] = _HOST_DONE, _now()
        else:
            entry[13], entry[5] = True, task

    def event_recorded(self, st, ev, task) -> None:
        e = self._entry("event", "record_event", st.ctx.client, st.id, task, depth=4)
        if e is not None:
            e["event"], e["gen"] = ev.id, ev.gen

    def event_waited(self, st, ev, task) -> None:
        e = self._entry("event", "stream_wait_event", st.ctx.client, st.id, task, depth=4)
        if e is not None:
            e["event"], e["gen"], e["event_card"] = ev.id, ev.gen, ev.ctx.name

    def waiting(self, op: str, st, fields: dict) -> dict | None:
        """A blocking host call (a synchronize): :meth:`waited` when it returns."""
        client = st.ctx.client
        e = self._entry("wait", op, client, st.id, None)
        if e is not None:
            e["target"] = client.submitted(st.id)
            e.update(fields)
        return e

    @staticmethod
    def waited(entry: dict, error: BaseException | None = None) -> None:
        entry["t_end"] = time.monotonic_ns()
        if error is not None:
            entry["error"] = str(getattr(error, "message", error))

    # -- dumps (rt/diag/dumps.py) -----------------------------------------------------------------
    def directory(self) -> str | None:
        return os.environ.get("NPUSIM_TRACE_DUMP_DIR") or None

    def rank_label(self) -> str:
        rank = os.environ.get("RANK")
        if rank is None and self.rank is not None:
            rank = str(self.rank)
        return rank if rank is not None else f"pid{os.getpid()}"

    def save_logs(self, client) -> None:
        """Before a context goes: keep its card's task log (when dumps or profiles may still want it). A later
        dump does not ask the closed channel again (each try would wait for a card that cannot answer)."""
        known = self.clients.pop(id(client), None) is not None     # released: later dumps use what is saved
        if client is self._last_client:
            self._last_client = None
        if known and not client.lost and (self.profile_dir or self.directory()):
            dumps.fetch_log(self, client)

    def dump(self, reason: str = "on demand", path: str | None = None) -> str | None:
        """Write this rank's dump (to ``path``, else the dump directory, else nothing); returns the path."""
        with self._lock:
            if path is None:
                where = self.directory()
                if where is None:
                    return None
                path = os.path.join(where, f"trace_rank{self.rank_label()}.json")
            data = dumps.snapshot(self, reason)
            self.reasons.append(reason)
            return dumps.write(path, data)

    def write_profile(self) -> str | None:
        if not self.profile_dir or not self.clients:
            return None
        with self._lock:
            data = dumps.snapshot(self, "profile")
            return dumps.write(os.path.join(self.profile_dir, f"profile_rank{self.rank_label()}.json"), data)

    def uncaught(self, text: str, reason: str) -> None:
        """The process is ending on an uncaught exception (``text``: its traceback): dump, if there is a
        directory to dump to."""
        self.exception = text[-8000:]
        dumps.dump_quietly(self, reason)


RECORDER = Recorder()
SEAM.register(RECORDER)


def dump(path: str | None = None, reason: str = "on demand") -> str | None:
    """Write this process's flight-recorder dump now: to ``path``, else ``NPUSIM_TRACE_DUMP_DIR``/
    ``trace_rank<N>.json``, else ``./trace_rank<N>.json``. Returns the file written."""
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
