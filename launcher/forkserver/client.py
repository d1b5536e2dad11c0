"""The launching process's side of the fork server: start it (once per process), ask it for ranks, learn their
exits (see the package docstring)."""

from __future__ import annotations

import array
import functools
import json
import os
import queue
import re
import signal
import socket
import subprocess
import threading

from ..deathsig import die_with_parent
from .server import MAX_MESSAGE

# Start-up shaping variables: a rank whose environment differs from the server's in any of them starts fresh.
STARTUP_VARS = ("PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS", "PYTHONDEVMODE",
                "PYTHONUTF8", "PYTHONIOENCODING", "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "PYTHONMALLOC",
                "PYTHONFAULTHANDLER", "PYTHONTRACEMALLOC", "PYTHONINSPECT", "PYTHONHOME", "PYTHONSTARTUP",
                "LD_PRELOAD", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMEXPR_NUM_THREADS", "VIRTUAL_ENV", "GLIBC_TUNABLES")
# Variables torch reads while it imports (TORCH_LOGS, PYTORCH_*, thread pools): a torch rank whose environment
# differs from the torch server's in any of them starts fresh.
TORCH_PREFIXES = ("TORCH", "PYTORCH", "KMP_", "GOMP_", "MKL_", "OMP_")
TORCH_PRELOAD = ("torch", "torch.distributed", "torch_npu")
_IMPORTS_TORCH = re.compile(r"^[ \t]*(?:import|from)[ \t]+torch(?:_npu)?\b", re.MULTILINE)
READY_TIMEOUT = 60.0
SERVE = "from launcher.forkserver.server import serve; serve()"


class ForkServer:
    """The launching process's handle on its server: ``spawn`` a rank, learn its exit through ``on_exit``."""

    def __init__(self, python: str, startup_env: dict, preload: tuple = ()):
        self.python = python
        self.torch = "torch" in preload
        self.startup_env = _startup(startup_env, self.torch)
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in startup_env.items() if k in self.startup_env or k in ("PATH", "HOME", "PYTHONPATH",
                                                                                         "TMPDIR", "LANG", "LC_ALL",
                                                                                         "NPUSIM_FORK_PRELOAD")}
        if preload:
            extra = env.get("NPUSIM_FORK_PRELOAD", "").split(",")
            env["NPUSIM_FORK_PRELOAD"] = ",".join(m for m in (*preload, *extra) if m)
        env.setdefault("OMP_NUM_THREADS", "1")
        env["OPENBLAS_NUM_THREADS"] = env["MKL_NUM_THREADS"] = env["OMP_NUM_THREADS"]
        self.proc = _keeper().run(lambda: subprocess.Popen(
            [python, "-c", SERVE, str(theirs.fileno())],
            pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=None, start_new_session=True, preexec_fn=functools.partial(die_with_parent, os.getpid())))
        theirs.close()
        self._lock = threading.Lock()
        self._ids = iter(range(1, 1 << 62))
        self._replies: dict[int, queue.SimpleQueue] = {}
        self._on_exit: dict[int, object] = {}
        self._early: dict[int, int] = {}       # exits reported before their callback was registered
        self.alive = True
        self._sock.settimeout(READY_TIMEOUT)
        try:
            hello = json.loads(self._sock.recv(MAX_MESSAGE) or b"{}")
        except (OSError, ValueError):
            hello = {}
        self._sock.settimeout(None)
        if not hello.get("ready"):
            self.close()
            raise RuntimeError(f"fork server did not start: {hello.get('why', 'no answer')}")
        threading.Thread(target=self._read, name="npusim-forkserver-reader", daemon=True).start()

    def suits(self, argv, env: dict) -> bool:
        """Whether a rank with this command line and environment can be forked from this server."""
        return (self.alive and len(argv) >= 3 and argv[0] == self.python and argv[1] == "-u"
                and _startup(env, self.torch) == self.startup_env)

    def spawn(self, argv, env: dict, cwd: str, stdout_fd: int, stderr_fd: int, on_exit) -> int:
        """Fork a rank running ``argv[2:]`` (after ``python -u``); returns its pid. ``on_exit(returncode)`` is
        called from the reader thread once the server reaped it."""
        rid = next(self._ids)
        box: queue.SimpleQueue = queue.SimpleQueue()
        with self._lock:
            self._replies[rid] = box
        msg = json.dumps({"id": rid, "program": list(argv[2:]), "env": env, "cwd": cwd}).encode()
        if len(msg) > MAX_MESSAGE:
            raise RuntimeError(f"fork server: the rank's environment is too large ({len(msg)} bytes)")
        try:
            self._sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(memoryview(
                array.array("i", [stdout_fd, stderr_fd]))))])
            reply = box.get(timeout=READY_TIMEOUT)
        except (OSError, queue.Empty) as e:
            self.alive = False
            raise RuntimeError(f"fork server: no answer to a start request ({e})") from None
        finally:
            with self._lock:
                self._replies.pop(rid, None)
        if "pid" not in reply:
            raise RuntimeError(f"fork server: {reply.get('error', 'fork failed')}")
        pid = reply["pid"]
        with self._lock:
            early = self._early.pop(pid, None)
            if early is None:
                self._on_exit[pid] = on_exit
        if early is not None:
            on_exit(early)
        return pid

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            msg = json.loads(data)
            if "exit" in msg:
                with self._lock:
                    fn = self._on_exit.pop(msg["exit"], None)
                    if fn is None:
                        self._early[msg["exit"]] = msg["code"]
                if fn is not None:
                    fn(msg["code"])
            else:
                with self._lock:
                    box = self._replies.get(msg.get("id"))
                if box is not None:
                    box.put(msg)
        self.alive = False                           # the server died: its ranks died with it (PDEATHSIG)
        with self._lock:
            pending, self._on_exit = self._on_exit, {}
        for fn in pending.values():
            fn(-int(signal.SIGKILL))

    def close(self) -> None:
        self.alive = False
        try:
            self._sock.close()
        finally:
            try:
                self.proc.kill()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                pass


class _Keeper:
    """A thread that lives as long as the process and starts the servers: PDEATHSIG fires when the thread
    that forked a child exits, so the server dies exactly when this process does."""

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="npusim-forkserver-keeper", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, box = self.jobs.get()
            try:
                box.put((True, fn()))
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                box.put((False, e))

    def run(self, fn):
        box: queue.SimpleQueue = queue.SimpleQueue()
        self.jobs.put((fn, box))
        ok, value = box.get()
        if not ok:
            raise value
        return value


_keeper_lock = threading.Lock()
_start_lock = threading.Lock()               # one server start at a time: a rank asking during prestart() waits
_keeper_obj: _Keeper | None = None
_server: ForkServer | None = None            # numpy, rt, hccl pre-imported: every rank
_torch_server: ForkServer | None = None      # torch and torch_npu too: ranks of programs that import torch


def _keeper() -> _Keeper:
    global _keeper_obj
    with _keeper_lock:
        if _keeper_obj is None:
            _keeper_obj = _Keeper()
        return _keeper_obj


def _startup(env: dict, torch: bool) -> dict:
    """The variables that shape a rank's start-up (and, for torch ranks, torch's import): a rank forks from a
    server only if they are the same for both."""
    shaping = {k: env.get(k) for k in STARTUP_VARS}
    if torch:
        shaping.update({k: v for k, v in env.items() if k.startswith(TORCH_PREFIXES)})
    return shaping


def imports_torch(argv) -> bool:
    """Whether the rank's program imports torch (``import torch`` / ``from torch...`` / torch_npu in a script or
    ``-c`` code): read, never run, and only the first MiB."""
    program = list(argv[2:])
    if not program or program[0] == "-m":
        return False
    if program[0] == "-c":
        text = program[1] if len(program) > 1 else ""
    else:
        try:
            with open(program[0], "rb") as f:
                text = f.read(1 << 20).decode("utf-8", "replace")
        except OSError:
            return False
    return _IMPORTS_TORCH.search(text) is not None


def server_for(argv, env: dict) -> ForkServer | None:
    """This process's fork server if the rank can use it (started on first use), else None. A program that
    imports torch gets a server with torch and torch_npu pre-imported (``NPUSIM_FORK_TORCH=0``: the plain one)."""
    global _server, _torch_server
    if os.environ.get("NPUSIM_FORK_SERVER", "1") == "0" or env.get("NPUSIM_FORK_SERVER") == "0":
        return None
    torch = (os.environ.get("NPUSIM_FORK_TORCH", "1") != "0" and env.get("NPUSIM_FORK_TORCH") != "0"
             and imports_torch(argv))
    with _start_lock:
        with _keeper_lock:
            server = _torch_server if torch else _server
        if server is None or not server.alive:
            if len(argv) < 3 or argv[1] != "-u":
                return None
            try:
                server = ForkServer(argv[0], env, TORCH_PRELOAD if torch else ())
            except (OSError, RuntimeError):
                return None
            with _keeper_lock:
                if torch:
                    old, _torch_server = _torch_server, server
                else:
                    old, _server = _server, server
            if old is not None:
                old.close()
    return server if server.suits(argv, env) else None


def prestart(argv, env: dict) -> threading.Thread:
    """Start, in a thread, the server that ranks running ``argv`` with environment ``env`` will ask for, so that
    its imports (numpy, rt, hccl; torch for a torch program) overlap what the caller does meanwhile — ``launch``:
    Ray's start. A rank that asks before it is ready waits for it (``server_for``); a failed start leaves the
    ranks to start it again or run fresh (``server_for`` returns None rather than raise)."""
    thread = threading.Thread(target=server_for, args=(argv, env), name="npusim-forkserver-prestart", daemon=True)
    thread.start()
    return thread
