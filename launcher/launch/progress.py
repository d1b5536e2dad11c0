"""``npusim: ranks joined n/N (t s)`` on launch's console while a large world's ranks join their world
communicator (``hccl.init``) — after "cards booted n/N", the other half of a large job's start-up.

The count comes from the job's board (``rt/ray/actor.py``: ``JobBoard.joined``), asked at most every
``EVERY`` seconds with one question outstanding at a time, never blocking the job loop that calls ``tick``.
"""

from __future__ import annotations

import sys
import time

EVERY = 1.0         # seconds between questions to the board (a report only when the count moved)


class JoinProgress:
    def __init__(self, ray, board, prefix: str, total: int):
        self._ray, self._board, self._prefix, self._total = ray, board, prefix, total
        self._started = time.monotonic()
        self._next = self._started            # the first question at once
        self._ref = None
        self._said = 0
        self.done = False

    def tick(self) -> None:
        """Ask the board, or read its answer, if it is time; print when the count moved."""
        if self.done:
            return
        now = time.monotonic()
        if self._ref is None:
            if now >= self._next:
                self._ref = self._board.joined.remote(self._prefix)
            return
        ready, _ = self._ray.wait([self._ref], timeout=0)
        if not ready:
            return
        ref, self._ref, self._next = self._ref, None, now + EVERY
        try:
            joined, _ = self._ray.get(ref)
        except self._ray.exceptions.RayError:
            self.done = True             # the board is gone: the job is ending, its own errors say why
            return
        if joined and joined != self._said:
            self._said = joined
            print(f"npusim: ranks joined {joined}/{self._total} ({now - self._started:.0f} s)", file=sys.stderr,
                  flush=True)
        self.done = joined >= self._total
