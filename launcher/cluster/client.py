"""The local cluster seen from outside the daemon: where its state and socket are, a lease of its cards, and
``launch --up`` / ``--down`` / ``--status`` (see the package docstring)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from rt.config import check_object_store, load_config
from rt.constants import AclErrorCode
from rt.errors import AclError
from rt.files import setup_dir
from rt.host import reaper
from rt.ray.session import socket_root

READY_TIMEOUT = 90.0
LEASE_WAIT = 300.0
DIR_NAME = "cluster"            # the daemon's directory inside the per-user npusim directory


def cluster_dir(create: bool = False, root: str | None = None) -> str:
    """The daemon's directory (state, socket, log) in ``root`` (default: the per-user npusim directory); created
    only by ``up`` and the daemon — a lookup leaves nothing behind."""
    d = os.path.join(socket_root(create=create) if root is None else root, DIR_NAME)
    if create:
        setup_dir(d, "the local cluster's directory")      # ours and 0700, never a link (rt/files.py)
    return d


def state_file(root: str | None = None) -> str:
    return os.path.join(cluster_dir(root=root), "cluster.json")


def sock_path() -> str:
    return os.path.join(cluster_dir(), "cluster.sock")


class Lease:
    """A connection to the daemon holding (at most) one lease of the node's cards."""

    def __init__(self, info: dict):
        self.info = info
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.settimeout(30)
            self.sock.connect(info["sock"])
        except OSError as e:
            self.sock.close()
            raise _gone(info, e, wait=0.0) from None
        self.file = self.sock.makefile("rwb")

    def call(self, msg: dict, timeout: float = 30.0) -> dict:
        try:
            self.sock.settimeout(timeout)
            self.file.write(json.dumps(msg).encode() + b"\n")
            self.file.flush()
            line = self.file.readline()
            reply = json.loads(line) if line else None
        except (OSError, ValueError) as e:   # a daemon killed mid-job: a broken pipe, a reset, half a reply
            raise _gone(self.info, e) from None
        if not isinstance(reply, dict):
            raise _gone(self.info, "it closed the connection")
        if "error" in reply:
            raise AclError(AclErrorCode.ACL_ERROR_RT_RESOURCE_ALLOC_FAIL, f"local cluster: {reply['error']}")
        return reply

    def acquire(self, job: str, cfg, wait: float = LEASE_WAIT) -> dict:
        return self.call({"op": "acquire", "job": job, "config": cfg.to_dict(), "pid": os.getpid(),
                          "wait": wait}, timeout=wait + 60)

    def release(self) -> None:
        self.call({"op": "release"}, timeout=60)

    def close(self) -> None:
        try:
            self.file.close()
        except OSError:  # the unsent tail of a request to a daemon that is gone
            pass
        finally:
            self.sock.close()


def _gone(info: dict, why, wait: float = 2.0) -> AclError:
    """The daemon stopped answering: an NpuError (a clean message, never a BrokenPipeError traceback); its
    leftover state file and socket are removed now (find() does that for a dead daemon), not at the next launch."""
    reason = getattr(why, "strerror", None) or why
    _forget_if_dead(info, wait)
    return AclError(AclErrorCode.ACL_ERROR_RT_FAILURE,
                    f"the local cluster (pid {info.get('pid')}, `launch --up`) stopped answering: {reason}")


def find(quiet: bool = False) -> dict | None:
    """The running local cluster's state, or None (a stale state file is removed)."""
    path = state_file()
    try:
        st = os.stat(path)
        with open(path) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    alive = st.st_uid == os.getuid() and pid_alive(info.get("pid"))
    if alive:
        try:
            c = Lease(info)
            try:
                info.update(c.call({"op": "status"}, timeout=5))
            finally:
                c.close()
            return info
        except (OSError, ValueError, AclError):
            alive = False
    if st.st_uid == os.getuid():
        _remove_state(info)
    return None


def _remove_state(info: dict) -> None:
    for p in (state_file(), info.get("sock", "")):
        try:
            os.unlink(p)
        except OSError:
            pass


def _forget_if_dead(info: dict, wait: float) -> None:
    """Remove the state file and socket of a daemon whose process is gone (and only then: a live one's are its)."""
    pid = info.get("pid")
    deadline = time.monotonic() + wait    # a daemon SIGKILLed mid-call takes a moment to be reaped
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not pid_alive(pid):
        try:
            with open(state_file()) as f:
                same = json.load(f).get("pid") == pid
        except (OSError, ValueError, AttributeError):
            same = False
        if same:                          # not the state of a daemon started since
            _remove_state(info)


def pid_alive(pid, start_time: int | None = None) -> bool:
    """The process runs and is not a zombie; with ``start_time`` (``reaper.start_time``), it is also the process
    that started then, so a reused pid is not taken for it."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    if start_time is not None and reaper.start_time(pid) != start_time:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def up(config=None) -> int:
    """``launch --up``: start the daemon (or report the running one); returns an exit status."""
    info = find()
    if info is not None:
        print(f"npusim: the local cluster is already up (pid {info['pid']}, {info['cards']} cards, "
              f"config {info['config_path']}); `launch --down` stops it")
        return 0
    cfg = load_config(config)                         # a bad config fails here, with its message
    check_object_store(cfg)                           # before the daemon starts Ray: its refusal is a traceback
    try:
        log = open(os.path.join(cluster_dir(create=True), "cluster.log"), "ab")
    except OSError as e:  # a full or read-only temp filesystem
        raise AclError(AclErrorCode.ACL_ERROR_WRITE_FILE, f"launch --up: cannot create the cluster's log in "
                                                          f"{cluster_dir()}: {e.strerror or e}") from None
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cluster", "serve", cfg.path], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log, start_new_session=True, cwd="/")
    log.close()
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print(f"npusim: the local cluster failed to start (exit {proc.returncode}); see "
                  f"{os.path.join(cluster_dir(), 'cluster.log')}", file=sys.stderr)
            return 1
        info = find()
        if info is not None and info.get("ready"):
            print(f"npusim: local cluster up (pid {info['pid']}, {info['cards']} warm cards, config "
                  f"{info['config_path']}); launch and spawn use it; `launch --down` stops it")
            return 0
        time.sleep(0.1)
    proc.kill()
    print("npusim: the local cluster did not become ready in time", file=sys.stderr)
    return 1


def down() -> int:
    info = find()
    if info is None:
        print("npusim: no local cluster is running")
        return 0
    try:
        c = Lease(info)
        c.call({"op": "stop"}, timeout=60)
        c.close()
    except (OSError, AclError):
        pass
    deadline = time.monotonic() + 60
    while pid_alive(info["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(info["pid"]):
        os.kill(info["pid"], signal.SIGKILL)
    shutil.rmtree(cluster_dir(), ignore_errors=True)            # its log and state: nothing is left behind
    print(f"npusim: local cluster (pid {info['pid']}) stopped")
    return 0


def status() -> int:
    info = find()
    if info is None:
        print("npusim: no local cluster is running (`launch --up` starts one)")
        return 1
    print(f"npusim: local cluster up: pid {info['pid']}, {info['cards']} cards, config {info['config_path']}, "
          f"{info['jobs']} jobs served, {'busy: ' + info['holder'] if info.get('holder') else 'idle'}")
    return 0


