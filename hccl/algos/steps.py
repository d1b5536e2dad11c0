"""One rank's part of one step of a schedule over mapped buffers: what the card (``hccl/card/collective.py``) and
the rank's own process (``hccl/hostsched.py``) both execute, so the two produce the same bits for the same
schedule — same transfers, same order, same reduction calls.

The barriers between steps are the caller's (the card's endpoint, or the host's wait with its hand-over).
"""

from __future__ import annotations

import numpy as np

from ..types import apply_reduce


def run_step(step, rank: int, arrays, rop: int, fetched=None) -> None:
    """Execute the transfers of ``step`` (a tuple of ``Transfer``) whose dst is ``rank``, in list order.

    ``arrays[r][buf]`` is rank r's buffer as a typed array; ``fetched`` maps a transfer's index in the step to
    data already brought from another node (``hccl/card/collective.py``), read instead of ``arrays``.
    """
    for i, t in enumerate(step):
        if t.dst != rank or not t.count:
            continue
        src = fetched[i] if fetched and i in fetched else arrays[t.src][t.src_buf][t.src_off: t.src_off + t.count]
        dst = arrays[t.dst][t.dst_buf][t.dst_off: t.dst_off + t.count]
        if t.reduce:
            apply_reduce(rop, dst, src)
        elif dst.ctypes.data != src.ctypes.data:      # in-place calls: a region onto itself
            np.copyto(dst, src)
