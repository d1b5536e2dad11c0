"""The launcher's backend without Ray or cards: node agents in this process (the internal ``--no-cards`` mode)."""

from __future__ import annotations

import threading
import time

from rt.ray.session import new_job_id

from ..agent import NodeAgent, RankSpec


class LocalBackend:
    """Node agents inside this process, with no Ray and no cards: the internal ``--no-cards`` mode.

    Same interface as ``ray_backend.RayBackend`` (``backends.py``), so the job loop cannot tell them apart; nnodes > 1
    simulates several nodes on this machine (useful to test rank → node placement).
    """

    def __init__(self, rc):
        self._news = threading.Event()
        self.agents = [NodeAgent(n, notify=self._news.set) for n in range(rc.nnodes)]
        self.hosts = ["127.0.0.1"] * rc.nnodes
        self.job_env: dict = {}

    def new_job_id(self) -> str:
        return new_job_id()

    def prepare(self, card_job: str) -> list[dict]:
        """Per-node environment additions for the attempt named ``card_job`` (cards would be created here)."""
        return [{} for _ in self.agents]

    def start(self, specs_per_node: list[list[RankSpec]], attempt: int) -> None:
        for agent, specs in zip(self.agents, specs_per_node):
            agent.start(specs, attempt)

    def poll(self, timeout: float) -> list[dict]:
        """News from any agent, waiting up to timeout for some."""
        self._news.clear()
        results = [r for r in (a.poll(0) for a in self.agents) if r["lines"] or r["exits"]]
        if results:
            return results
        self._news.wait(timeout)
        return [r for r in (a.poll(0) for a in self.agents) if r["lines"] or r["exits"]]

    def wake(self) -> None:
        """Make a pending poll() return now (a signal arrived)."""
        self._news.set()

    def stop(self, grace: float) -> None:
        """SIGTERM every rank on every node, SIGKILL after grace seconds, wait for all to exit."""
        for a in self.agents:
            a.terminate()
        deadline = time.monotonic() + grace
        for a in self.agents:
            a.wait_all(max(0.0, deadline - time.monotonic()))
        for a in self.agents:
            a.kill()
        for a in self.agents:
            if not a.wait_all(30.0):
                raise RuntimeError(f"node agent {a.node_index}: ranks survived SIGKILL for 30 s")

    def release(self) -> None:
        """Free the attempt's cards (none here)."""

    def close(self) -> None:
        for a in self.agents:
            a.shutdown()
