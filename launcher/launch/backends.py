"""Which backend a job runs on; each has the same small interface, so the job loop cannot tell them apart.

- ``LocalBackend`` (``local_backend.py``): node agents in this process, no Ray, no cards (``--no-cards``).
- ``ClusterBackend`` (``cluster_backend.py``): the warm cards of the persistent local cluster (``launch --up``),
  borrowed per attempt; no Ray in this process.
- ``RayBackend`` (``ray_backend.py``): the caller's Ray session, ``--address``, or an embedded one; card actors.

The interface: ``hosts`` (per node), ``new_job_id()``, ``prepare(card_job)`` (the attempt's cards; returns each
node's extra rank environment), ``start(specs_per_node, attempt)``, ``poll(timeout)`` (news from the node agents),
``stop(grace)``, ``release()`` (the attempt's cards), ``close()``.
"""

from __future__ import annotations

import os
import sys

from .. import cluster
from .cluster_backend import ClusterBackend
from .config import RunConfig
from .local_backend import LocalBackend
from .ray_backend import RayBackend, ray_initialized

_told_cluster = False


def make_backend(rc: RunConfig):
    """The backend of this job: no cards, the local cluster when it is up and fits, else Ray."""
    if not rc.cards:
        return LocalBackend(rc)
    backend = _cluster_backend(rc)
    if backend is not None:
        return backend
    return RayBackend(rc)


def _cluster_backend(rc: RunConfig):
    """The persistent local cluster's backend (``launch --up``) when it is up and fits the job, else None."""
    global _told_cluster
    if rc.nnodes != 1 or rc.address or ray_initialized() or os.environ.get("NPUSIM_CLUSTER", "1") == "0":
        return None
    info = cluster.find()
    if info is None:
        return None
    if info.get("config") != rc.hw.to_dict():
        print(f"npusim: the local cluster (pid {info['pid']}) runs config {info['config_path']}, this job asks "
              f"for {rc.hw.path}: starting an embedded session instead", file=sys.stderr)
        return None
    if not _told_cluster:
        print(f"npusim: using the local cluster (pid {info['pid']}, started by `launch --up`)", file=sys.stderr)
        _told_cluster = True
    return ClusterBackend(rc, info)
