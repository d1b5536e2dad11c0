"""A blocking rendezvous by key: the parties of one key wait for each other, each bringing a value, and all of
them get every value (in index order). The job's board (``rt/ray/actor.py``) runs one for a job's card actors;
a package extending the card may run its own for the cards inside one process."""

from __future__ import annotations

import threading
import time

MAX_WAIT = 86400.0          # a day: far past any timeout a caller means; keeps Condition.wait finite


class Rendezvous:
    """Thread-safe; a waiting party holds its own thread, nothing else."""

    def __init__(self):
        self._entries: dict[str, dict] = {}
        self._cv = threading.Condition()

    def join(self, key: str, count: int, index: int, value, timeout: float) -> dict:
        """``{"values": [...]}`` once all ``count`` joined; ``{"joined": [...]}`` on timeout; ``{"twice": True}``
        if ``index`` already joined. The callers check ``timeout``; here it is only kept finite and >= 0, since
        ``Condition.wait`` raises OverflowError for inf and nan never expires."""
        timeout = float(min(timeout, MAX_WAIT)) if timeout >= 0 else 0.0   # nan >= 0 is False
        deadline = time.monotonic() + timeout
        with self._cv:
            entry = self._entries.setdefault(key, {"values": {}, "left": count})
            if index in entry["values"]:
                return {"twice": True}
            entry["values"][index] = value
            self._cv.notify_all()
            while len(entry["values"]) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"joined": sorted(entry["values"])}
                self._cv.wait(left)
            values = [entry["values"][i] for i in range(count)]
            entry["left"] -= 1
            if not entry["left"]:                # the last party out forgets the key
                self._entries.pop(key, None)
            return {"values": values}
