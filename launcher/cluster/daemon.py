"""The ``launch --up`` daemon's own process: an embedded Ray session whose cards stay warm, lent to one job at a
time over a Unix socket (see the package docstring). Run as ``python -m launcher.cluster serve CONFIG``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import threading
import time

from rt.config import load_config

from .client import LEASE_WAIT, cluster_dir, sock_path, state_file


class _Daemon:
    """The cards, Ray and the one lease: state shared by the connections' threads."""

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
        return {"socket_dir": cards.socket_dir, "address": self.address, "auth": self.session.auth_env()}

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
    cluster_dir(create=True)
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
    shutil.rmtree(cluster_dir(), ignore_errors=True)     # a clean stop (SIGTERM too) leaves nothing, as `launch --down`
