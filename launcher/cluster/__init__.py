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

Two processes: ``client.py`` runs in whoever looks for the cluster or borrows its cards (``launch`` and its
``--up``/``--down``/``--status``, ``spawn``, the pytest plugin, ``npu-smi``); ``daemon.py`` is the daemon,
started by ``up()`` as ``python -m launcher.cluster serve CONFIG``.
"""

from .client import Lease, down, find, status, up

__all__ = ["Lease", "down", "find", "status", "up"]
