"""Where in the user's program a call came from: the innermost frame outside npusim's own packages.

``ROOT`` is the directory holding npusim's packages (a source checkout, or site-packages); ``PACKAGE_DIRS`` is
the one list of their directories, shared by the flight recorder (``rt/diag/recorder.py``), the race detector
(``rt/diag/racecheck.py``) and the host log (``rt/diag/slog.py``), so all three name the same line for the same
call; ``launcher/`` puts ``ROOT`` on a rank's PYTHONPATH.
"""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The libraries of the distribution: their frames are never the user's call site.
PACKAGE_DIRS = tuple(os.path.join(ROOT, d, "") for d in ("rt", "hccl", "acl", "torch_npu"))
# Its tools (launch, spawn): their frames are the outermost of a rank, below the user's program.
TOOL_DIRS = (os.path.join(ROOT, "launcher", ""),)


def outside(frame, dirs: tuple = PACKAGE_DIRS):
    """``frame`` or the first frame it was called from whose code is not under ``dirs`` (None: there is none)."""
    while frame is not None and frame.f_code.co_filename.startswith(dirs):
        frame = frame.f_back
    return frame


def text(code, line: int) -> str:
    """``file.py:N`` of a code object and line."""
    return f"{os.path.basename(code.co_filename)}:{line}"
