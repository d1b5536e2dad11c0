"""The fork server's own process: import what every rank imports, then fork a rank for each request and report
each exit (see the package docstring). Started by ``client.py`` as ``python -c "<SERVE>" FD``."""

from __future__ import annotations

import array
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import sys

from . import child

PRELOAD = ("numpy", "msgpack", "psutil", "cloudpickle", "rt", "rt.mdl", "rt.host.copies", "hccl", "hccl.api",
           "launcher.spawned")
MAX_MESSAGE = 1 << 20


def serve() -> None:
    """The server's main loop (``python -c "from launcher.forkserver.server import serve; serve()" FD``)."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    extra = [m for m in os.environ.get("NPUSIM_FORK_PRELOAD", "").split(",") if m]   # e.g. the pytest plugin's
    for name in (*PRELOAD, *extra):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a rank that needs it imports it (and reports the error) itself
            pass
    # What the ranks inherit stays shared: the server no longer collects (a collection here would leave holes
    # the children's allocations fill, dirtying shared pages), and each fork first freezes everything
    # (``gc.freeze``), so a child's collections never write to the inherited objects' headers. No collection
    # before freezing either: it would cost the torch server 0.17 s of start-up, and garbage left frozen is
    # shared, not copied. The child turns collection back on at once (``child.become_rank``).
    gc.disable()
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
                    fds += list(array.array("i", blob[: len(blob) - len(blob) % 4]))
            req = json.loads(data)
            if len(fds) != 2:
                for fd in fds:
                    os.close(fd)
                sock.send(json.dumps({"id": req.get("id"), "error": "expected 2 descriptors"}).encode())
                continue
            gc.freeze()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                os.close(wake_r)
                os.close(wake_w)
                child.become_rank(req, fds[0], fds[1], sock)    # never returns
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
