"""A child that dies with its parent: ``PR_SET_PDEATHSIG``, shared by every launcher process that starts one.

The node agent sets it on the ranks it starts itself, the fork server's handle on the server, and the server's
children on themselves. Linux sends the signal when the *thread* that forked the child exits, which is why
the agent forks from its long-lived I/O thread and the fork server's handle from a keeper thread.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
# Loaded now, in the parent: a child forked from a threaded process must not dlopen between fork and exec.
_LIBC = ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent_pid: int) -> None:
    """In a freshly forked child: get SIGKILL when the parent exits, and exit now if it already has."""
    _LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:      # the parent died before prctl took effect
        os._exit(1)
