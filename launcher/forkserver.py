"""A pre-imported, single-threaded fork server for rank processes.

A rank is ``python -u <program>``; a fresh interpreter that imports numpy, ``rt`` and ``hccl`` costs ~0.2 s of
CPU, and 8 of them on a 2-core laptop are most of a small distributed test. The fork server is one such
interpreter, started once per launching process with those modules imported and no threads (BLAS pinned to one
thread before numpy loads); each rank is a ``fork`` of it that then becomes exactly what ``python -u`` would
have been: its own session, the rank's environment, working directory, ``sys.argv``, ``sys.path`` and stdio
(the agent's pipes, passed over the server's socket), the program run as ``__main__`` (``-c``, a script, or
``-m``), and the same exit status — an uncaught exception's traceback and status 1, ``sys.exit``'s code, death
by SIGINT after a KeyboardInterrupt. Ranks die with the server (PDEATHSIG), the server dies with the launching
process (PDEATHSIG, set from a thread that lives as long as the process), and the server reports each rank's
exit status, which only it can reap.

Used only when the result is indistinguishable from a fresh interpreter: the rank runs this Python with ``-u``
and no environment variable that shapes interpreter start-up differs from the server's (``PYTHONHASHSEED``,
``PYTHONWARNINGS``, ``OMP_NUM_THREADS``, ``LD_PRELOAD``, ...); otherwise, or with ``NPUSIM_FORK_SERVER=0``,
ranks start as before. One difference remains by construction: ranks forked from one server share its hash
seed (``hash()`` of a str is the same on every rank); set ``NPUSIM_FORK_SERVER=0`` to give each its own.
``NPUSIM_FORK_PRELOAD=mod1,mod2`` adds modules the server imports before forking (the pytest plugin adds
``pytest``, which every rank of a test imports with the test's module).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading

PRELOAD = ("numpy", "msgpack", "psutil", "cloudpickle", "rt", "rt.mdl", "rt.host.copies", "hccl", "hccl.api",
           "launcher.spawn")
# Start-up shaping variables: a rank whose environment differs from the server's in any of them starts fresh.
STARTUP_VARS = ("PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS", "PYTHONDEVMODE",
                "PYTHONUTF8", "PYTHONIOENCODING", "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "PYTHONMALLOC",
                "PYTHONFAULTHANDLER", "PYTHONTRACEMALLOC", "PYTHONINSPECT", "PYTHONHOME", "PYTHONSTARTUP",
                "LD_PRELOAD", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMEXPR_NUM_THREADS", "VIRTUAL_ENV")
PR_SET_PDEATHSIG = 1
MAX_MESSAGE = 1 << 20
READY_TIMEOUT = 30.0


# ================================================================================= the launching side
class ForkServer:
    """The launching process's handle on its server: ``spawn`` a rank, learn its exit through ``on_exit``."""

    def __init__(self, python: str, startup_env: dict):
        self.python = python
        self.startup_env = {k: startup_env.get(k) for k in STARTUP_VARS}
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in startup_env.items() if k in STARTUP_VARS or k in ("PATH", "HOME", "PYTHONPATH",
                                                                                     "TMPDIR", "LANG", "LC_ALL",
                                                                                     "NPUSIM_FORK_PRELOAD")}
        env.setdefault("OMP_NUM_THREADS", "1")
        env["OPENBLAS_NUM_THREADS"] = env["MKL_NUM_THREADS"] = env["OMP_NUM_THREADS"]
        self.proc = _keeper().run(lambda: subprocess.Popen(
            [python, "-c", "from launcher.forkserver import serve; serve()", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=None, start_new_session=True, preexec_fn=_die_with_parent(os.getpid())))
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
                and all(env.get(k) == v for k, v in self.startup_env.items()))

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
                __import__("array").array("i", [stdout_fd, stderr_fd]))))])
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
_keeper_obj: _Keeper | None = None
_server: ForkServer | None = None


def _keeper() -> _Keeper:
    global _keeper_obj
    with _keeper_lock:
        if _keeper_obj is None:
            _keeper_obj = _Keeper()
        return _keeper_obj


def server_for(argv, env: dict) -> ForkServer | None:
    """This process's fork server if the rank can use it (started on first use), else None."""
    global _server
    if os.environ.get("NPUSIM_FORK_SERVER", "1") == "0" or env.get("NPUSIM_FORK_SERVER") == "0":
        return None
    with _keeper_lock:
        server = _server
    if server is None or not server.alive:
        if len(argv) < 3 or argv[1] != "-u":
            return None
        try:
            server = ForkServer(argv[0], env)
        except (OSError, RuntimeError):
            return None
        with _keeper_lock:
            old, _server = _server, server
        if old is not None:
            old.close()
    return server if server.suits(argv, env) else None


def _die_with_parent(parent: int):
    def setup():
        import ctypes
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
    return setup


# =================================================================================== the server
def serve() -> None:
    """The server's main loop (``python -c "from launcher.forkserver import serve; serve()" FD``)."""
    from . import forkchild
    sock = socket.socket(fileno=int(sys.argv[1]))
    import importlib
    extra = [m for m in os.environ.get("NPUSIM_FORK_PRELOAD", "").split(",") if m]   # e.g. the pytest plugin's
    for name in (*PRELOAD, *extra):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a rank that needs it imports it (and reports the error) itself
            pass
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        sock.send(json.dumps({"ready": False, "why": f"{threads} threads after imports"}).encode())
        return
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sock.send(json.dumps({"ready": True, "pid": os.getpid()}).encode())
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, "req")
    sel.register(wake_r, selectors.EVENT_READ, "chld")
    children: set[int] = set()
    while True:
        for key, _ in sel.select():
            if key.data == "chld":
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                _reap(sock, children)
                continue
            try:
                data, ancdata, _, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(2 * 4))
            except InterruptedError:
                continue
            if not data:                               # the launching process is gone: so are its ranks
                for pid in children:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except OSError:
                        pass
                return
            fds = []
            for level, kind, blob in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds += list(__import__("array").array("i", blob[: len(blob) - len(blob) % 4]))
            req = json.loads(data)
            if len(fds) != 2:
                for fd in fds:
                    os.close(fd)
                sock.send(json.dumps({"id": req.get("id"), "error": "expected 2 descriptors"}).encode())
                continue
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                os.close(wake_r)
                os.close(wake_w)
                forkchild.become_rank(req, fds[0], fds[1], sock)    # never returns
            for fd in fds:
                os.close(fd)
            children.add(pid)
            sock.send(json.dumps({"id": req["id"], "pid": pid}).encode())


def _reap(sock, children: set[int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        try:
            sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
        except OSError:
            pass
