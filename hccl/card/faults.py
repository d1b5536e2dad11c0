"""The card's half of ``fail`` and ``corrupt`` faults (``NPUSIM_FAULTS``; the host half, which decides them, is
``rt/diag/faults.py``).

The host marks the collective (or send/recv) it injects into with ``params["fault"]`` (a p2p task gets the list
as an extra argument): a list of ``{"action": "fail" | "corrupt", ...}``. The task runs the collective as usual
— its peers see nothing unusual — and then inverts the bytes this rank received (corrupt) and/or fails the task
with the given HcclResult (fail), so the error surfaces at the covering synchronize like any failed collective:
``task hccl_collective#N on stream S of card C (node 0) failed: <op> #<seq> on comm '<id>' (rank R): ...``.
"""

from __future__ import annotations

from ..errors import PEER_CODES, RESULT_TEXTS, HcclError
from ..types import HcclResult


def injected(ext, run, faults: list, what, received: list):
    """The stream task: ``run`` (the collective), then the faults; ``what`` names the call in the error (a str,
    or a function called after ``run``); ``received`` are this rank's receive views ``(segment, offset, nbytes)``."""
    def task():
        run()
        for f in faults:
            if f["action"] == "corrupt":
                for view in received:
                    if view is not None and view[2]:
                        n = min(view[2], f["bytes"]) if f["bytes"] else view[2]
                        data = ext.card.memory.segment(view[0]).array[view[1]: view[1] + n]
                        data ^= 0xFF
        for f in faults:
            if f["action"] == "fail":
                raise HcclError(f["code"], f"{what() if callable(what) else what}: {_text(f['code'])} {f['note']}")
    return task


def _text(code: int) -> str:
    """How an injected failure reads: the code's name and the header's description, CANN's tag first
    (``EI0002 HCCL_E_TIMEOUT: timeout``)."""
    name = HcclResult(code).name
    return f"{'EI0002 ' if code in PEER_CODES else ''}{name}: {RESULT_TEXTS[name]}"
