"""The launcher's backend on the persistent local cluster (``launch --up``): no Ray in this process — the
job borrows the cluster's warm cards for each attempt and runs its ranks with a node agent of its own."""

from __future__ import annotations

import select
import socket
import sys
import threading

from rt.errors import AclError

from ..cluster import Lease
from .local_backend import LocalBackend

WATCH_TICK = 1.0        # s: how often the daemon watch looks whether the attempt ended


class ClusterBackend(LocalBackend):
    """Same interface as ``ray_backend.RayBackend`` (one node: the cluster's).

    While an attempt runs, a thread watches the lease's connection: a daemon that dies takes its Ray session
    and the borrowed cards with it, so the attempt's ranks are stopped at once (they would only fail at their
    next card call) and the job ends in the failure box, with one line saying why."""

    def __init__(self, rc, info: dict):
        super().__init__(rc)
        self._rc, self.info = rc, info
        self._lease = Lease(info)
        self._watching: threading.Event | None = None
        self._told = False                  # the watch already said the daemon is gone

    def prepare(self, card_job: str) -> list[dict]:
        lease = self._lease.acquire(card_job, self._rc.hw)
        return [{"NPUSIM_JOB": card_job, "NPUSIM_CARD_DIR": lease["socket_dir"],
                 "NPUSIM_RAY_ADDRESS": lease["address"], **lease.get("auth", {})}]

    def start(self, specs_per_node, attempt: int) -> None:
        super().start(specs_per_node, attempt)
        self._watching = threading.Event()
        self._watching.set()
        threading.Thread(target=self._watch_daemon, args=(self._watching,), name="npusim-cluster-watch",
                         daemon=True).start()

    def _watch_daemon(self, watching: threading.Event) -> None:
        """Until the attempt stops: an end of file on the lease's connection is the daemon gone."""
        sock = self._lease.sock
        while watching.is_set():
            try:
                ready = select.select([sock], [], [], WATCH_TICK)[0]
                gone = bool(ready) and sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
            except BlockingIOError:
                continue
            except (OSError, ValueError):   # reset by the dying daemon, or closed by close()
                gone = watching.is_set()
            if gone and watching.is_set():
                print(f"npusim: the local cluster (pid {self.info.get('pid')}, `launch --up`) stopped answering "
                      f"while the job ran; its cards went with it: stopping the ranks", file=sys.stderr, flush=True)
                self._told = True
                for agent in self.agents:
                    agent.terminate()
                return
            if ready and not gone:          # the daemon never speaks unasked; do not spin on it
                watching.wait(WATCH_TICK)

    def stop(self, grace: float) -> None:
        if self._watching is not None:
            self._watching.clear()
        super().stop(grace)

    def release(self) -> None:
        """Give the attempt's cards back (the cluster resets them for the next job). A daemon that died during
        the attempt took its cards with it: nothing to give back, and the ranks' failures tell the job's story."""
        try:
            self._lease.release()
        except AclError as e:
            if not self._told:
                print(f"npusim: {e.message}", file=sys.stderr)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._lease.close()
