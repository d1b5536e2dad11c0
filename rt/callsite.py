"""Where in the user's program a call came from: the innermost frame outside npusim's own packages.

Shared by the flight recorder (``rt/host/recorder.py``), the race detector (``rt/host/racecheck.py``) and the
host log (``rt/slog.py``), so all three name the same line for the same call.
"""

from __future__ import annotations

import os

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_DIRS = tuple(os.path.join(_ROOT, d, "") for d in ("rt", "hccl", "acl", "torch_npu"))


def outside(frame, dirs: tuple = PACKAGE_DIRS):
    """``frame`` or the first frame it was called from whose code is not under ``dirs`` (None: there is none)."""
    while frame is not None and frame.f_code.co_filename.startswith(dirs):
        frame = frame.f_back
    return frame


def text(code, line: int) -> str:
    """``file.py:N`` of a code object and line."""
    return f"{os.path.basename(code.co_filename)}:{line}"
