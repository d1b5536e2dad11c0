"""A persistent local cluster: ``launch --up`` keeps a Ray session with booted cards, ``launch --down`` stops it.

``launch --up`` starts a daemon (its own session, stdio to ``cluster.log``) that runs an embedded Ray session
on 127.0.0.1 and keeps the node's cards warm (``rt/ray/pool.py``). It answers on a Unix socket (0600, in the
per-user 0700 directory, beside a state file naming its pid): ``launch`` and ``spawn`` find it, say so in one
line, and borrow the cards for a job instead of starting Ray and booting cards — a lease that ends when the
job releases it or the borrower's connection closes (it died), after which the cards are reset for the next
job. No Ray in the borrowing process at all: its ranks reach the cards over their sockets as under ``launch``.
A state file whose daemon is gone, belongs to another user, or does not answer is stale: it is removed and
ignored, and the job falls back to the embedded session. One job holds the cards at a time; another waits for
them (and says whose job it waits for).

    launch --up [--config NAME]     start it (idempotent: a running cluster is reported, not duplicated)
    launch --down                   stop it (cards, Ray, files)
    launch --status                 one line about it
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from rt.config import check_object_store, load_config
from rt.constants import AclErrorCode
from rt.errors import AclError

READY_TIMEOUT = 90.0
LEASE_WAIT = 300.0


def _dir(create: bool = False) -> str:
    """The daemon's directory (state, socket, log); created only by ``up`` — a lookup leaves nothing behind."""
    from rt.files import setup_dir
    from rt.ray.session import socket_root
    d = os.path.join(socket_root(create=create), "cluster")
    if create:
        setup_dir(d, "the local cluster's directory")      # ours and 0700, never a link (rt/files.py)
    return d


def state_file() -> str:
    return os.path.join(_dir(), "cluster.json")


def sock_path() -> str:
    return os.path.join(_dir(), "cluster.sock")


# =========================================================================== clients
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
    alive = st.st_uid == os.getuid() and _pid_alive(info.get("pid"))
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
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not _pid_alive(pid):
        try:
            with open(state_file()) as f:
                same = json.load(f).get("pid") == pid
        except (OSError, ValueError, AttributeError):
            same = False
        if same:                          # not the state of a daemon started since
            _remove_state(info)


def _pid_alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def up(config=None) -> int:
    """``launch --up``: start the daemon (or report the running one); returns an exit status."""
    info = find()
    if info is not None:
        print(f"npusim: the local cluster is already up (pid {info['pid']}, {info['cards']} cards, "
              f"config {info['config_path']}); `launch --down` stops it")
        return 0
    from .config import config_name
    cfg = load_config(config_name(config))            # a bad config fails here, with its message
    check_object_store(cfg)                           # before the daemon starts Ray: its refusal is a traceback
    try:
        log = open(os.path.join(_dir(create=True), "cluster.log"), "ab")
    except OSError as e:  # a full or read-only temp filesystem
        raise AclError(AclErrorCode.ACL_ERROR_WRITE_FILE, f"launch --up: cannot create the cluster's log in "
                                                          f"{_dir()}: {e.strerror or e}") from None
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cluster", "serve", cfg.path], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log, start_new_session=True, cwd="/")
    log.close()
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print(f"npusim: the local cluster failed to start (exit {proc.returncode}); see "
                  f"{os.path.join(_dir(), 'cluster.log')}", file=sys.stderr)
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
    while _pid_alive(info["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _pid_alive(info["pid"]):
        os.kill(info["pid"], signal.SIGKILL)
    import shutil
    shutil.rmtree(_dir(), ignore_errors=True)            # its log and state: nothing is left behind
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


# =========================================================================== the daemon
class _Daemon:
    def __init__(self, config_path: str):
        from rt.ray import pool, session
        import ray
        self.cfg = load_config(config_path)
        session.start_local_ray(self.cfg)
        self.ray, self.pool, self.session = ray, pool, session
        self.node_id = ray.get_runtime_context().get_node_id()
        cards = pool.acquire("warm-up", 0, self.node_id, self.cfg)
        pool.release(cards)                                   # booted and idle: the first job gets them at once
        self.cond = threading.Condition()
        self.holder: dict | None = None                       # {"job", "pid", "cards", "conn"}
        self.jobs = 0
        self.stopping = threading.Event()
        self.address = ray.get_runtime_context().gcs_address

    def status(self) -> dict:
        with self.cond:
            holder = self.holder
        return {"ready": True, "pid": os.getpid(), "cards": self.cfg.cards_per_node, "config_path": self.cfg.path,
                "config": self.cfg.to_dict(), "jobs": self.jobs, "address": self.address,
                "holder": f"job {holder['job']} of pid {holder['pid']}" if holder else None}

    def acquire(self, conn_id, msg) -> dict:
        if msg.get("config") != self.cfg.to_dict():
            return {"error": f"it runs config {self.cfg.path}, the job asks for another"}
        deadline = time.monotonic() + float(msg.get("wait", LEASE_WAIT))
        with self.cond:
            while self.holder is not None and self.holder["conn"] != conn_id:
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"error": f"its cards are busy with job {self.holder['job']} of pid "
                                     f"{self.holder['pid']}"}
                self.cond.wait(left)
            if self.holder is not None:
                return {"error": "this connection holds the cards already"}
            self.holder = {"job": msg.get("job"), "pid": msg.get("pid"), "conn": conn_id, "cards": None}
        try:
            cards = self.pool.acquire(str(msg.get("job")), 0, self.node_id, self.cfg)
            self.session.wait_cards(cards)
        except Exception as e:  # noqa: BLE001 - reported to the borrower
            with self.cond:
                self.holder = None
                self.cond.notify_all()
            return {"error": f"cannot prepare the cards: {e}"}
        with self.cond:
            self.holder["cards"] = cards
        return {"socket_dir": cards.socket_dir, "address": self.address, "auth": {k: os.environ[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
                                                  if k in os.environ}}

    def release(self, conn_id) -> dict:
        with self.cond:
            holder = self.holder if self.holder and self.holder["conn"] == conn_id else None
        if holder is None:
            return {"released": False}
        if holder["cards"] is not None:
            self.pool.release(holder["cards"])                # reset: the next job sees nothing of this one
        with self.cond:
            self.holder = None
            self.jobs += 1
            self.cond.notify_all()
        return {"released": True}

    def serve_conn(self, conn: socket.socket) -> None:
        f = conn.makefile("rwb")
        conn_id = id(conn)
        try:
            for line in f:
                msg = json.loads(line)
                op = msg.get("op")
                if op == "status":
                    reply = self.status()
                elif op == "acquire":
                    reply = self.acquire(conn_id, msg)
                elif op == "release":
                    reply = self.release(conn_id)
                elif op == "stop":
                    reply = {"stopping": True}
                    self.stopping.set()
                else:
                    reply = {"error": f"unknown op {op!r}"}
                f.write(json.dumps(reply).encode() + b"\n")
                f.flush()
        except (OSError, ValueError):
            pass
        finally:
            self.release(conn_id)                             # a borrower that died gives its cards back
            try:
                f.close()
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self.pool.drain()
        self.session.stop_ray()


def serve(config_path: str) -> None:
    """The daemon's main (``python -m launcher.cluster serve CONFIG``)."""
    _dir(create=True)
    daemon = _Daemon(config_path)
    path = sock_path()
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)
    signal.signal(signal.SIGTERM, lambda *_: daemon.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: daemon.stopping.set())
    tmp = state_file() + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "sock": path, "config_path": daemon.cfg.path, "started": time.time()}, f)
    os.replace(tmp, state_file())

    def accept():
        while not daemon.stopping.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=daemon.serve_conn, args=(conn,), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()
    print(f"npusim local cluster: pid {os.getpid()}, config {daemon.cfg.path}, socket {path}", flush=True)
    daemon.stopping.wait()                    # signals interrupt the wait (SIGTERM/SIGINT set it)
    listener.close()
    for p in (state_file(), path):
        try:
            os.unlink(p)
        except OSError:
            pass
    daemon.close()
    print("npusim local cluster: stopped", flush=True)
    import shutil
    shutil.rmtree(_dir(), ignore_errors=True)     # a clean stop (SIGTERM too) leaves nothing, as `launch --down`


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit("usage: python -m launcher.cluster serve CONFIG  (use `launch --up` / `launch --down`)")
