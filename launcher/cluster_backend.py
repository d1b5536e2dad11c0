"""The launcher's backend on the persistent local cluster (``launch --up``): no Ray in this process — the
job borrows the cluster's warm cards for each attempt and runs its ranks with a node agent of its own."""

from __future__ import annotations

import sys

from rt.errors import AclError

from .cluster import Lease
from .local_backend import LocalBackend


class ClusterBackend(LocalBackend):
    """Same interface as ``ray_backend.RayBackend`` (one node: the cluster's)."""

    def __init__(self, rc, info: dict):
        super().__init__(rc)
        self._rc, self.info = rc, info
        self._lease = Lease(info)

    def prepare(self, job_id: str, attempt: int) -> list[dict]:
        card_job = job_id if attempt == 0 else f"{job_id}r{attempt}"
        lease = self._lease.acquire(card_job, self._rc.hw)
        return [{"NPUSIM_JOB": card_job, "NPUSIM_CARD_DIR": lease["socket_dir"],
                 "NPUSIM_RAY_ADDRESS": lease["address"], **lease.get("auth", {})}]

    def release(self) -> None:
        """Give the attempt's cards back (the cluster resets them for the next job). A daemon that died during
        the attempt took its cards with it: nothing to give back, and the ranks' failures tell the job's story."""
        try:
            self._lease.release()
        except AclError as e:
            print(f"npusim: {e.message}", file=sys.stderr)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._lease.close()
