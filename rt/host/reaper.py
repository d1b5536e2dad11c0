"""A watchdog process that cleans up after this process, however it ends — also after SIGKILL.

What npusim starts outlives its starter in a few ways when the starter is killed outright: Ray's dashboard
and runtime-env agents are re-parented to init and linger for a minute, and card-socket directories, rank
tables and Ray's session directory stay on disk. So the first process that starts something of that kind
starts one reaper (a tiny stdlib-only Python process) and tells it over a pipe what to clean:

- ``tag(token)``: the processes that inherited ``NPUSIM_REAP=<token>`` in their environment: the embedded
  Ray session sets it only while ``ray.init`` starts Ray's processes, so it marks exactly those and what
  they start (agents, workers, card actors) — never the user's own subprocesses. The reaper finds them by
  reading ``/proc/<pid>/environ`` of our own user's processes, and kills them by pid;
- ``path(dir)``: directories to remove (``forget(dir)`` when we removed it ourselves).

The reaper blocks reading the pipe. It reads EOF when this process exits or dies (only this process holds
the write end: the fd is not inheritable), then kills what carries a tag, waits for it to go, removes the
paths and exits. ``sweep(token)`` does the same for one token while this process lives (after
``ray.shutdown``, whose agents would otherwise linger for a minute).

This file imports only the standard library: the reaper runs it as a script (``python -I -S reaper.py``),
cheaply and without the package on ``sys.path``.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time

ENV = "NPUSIM_REAP"
_lock = threading.Lock()
_reaper: "_Reaper | None" = None


class _Reaper:
    def __init__(self):
        read, self._write = os.pipe()             # both non-inheritable: only the reaper gets the read end
        env = {k: v for k, v in os.environ.items() if k != ENV}
        os.set_inheritable(read, True)
        try:
            # In its own session (a Ctrl-C or killpg of our group does not reach it), holding no pipe of ours;
            # never waited for: it outlives us by design.
            quiet = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
            self.child = os.posix_spawn(sys.executable, [sys.executable, "-I", "-S", os.path.abspath(__file__),
                                                         str(read), str(os.getpid())], env, setsid=True,
                                        file_actions=quiet)
        finally:
            os.close(read)
        self.pid = os.getpid()

    def send(self, line: str) -> None:
        try:
            os.write(self._write, (line + "\n").encode())
        except OSError:
            pass


def _get() -> _Reaper:
    global _reaper
    with _lock:
        if _reaper is None or _reaper.pid != os.getpid():     # a forked child needs its own
            _reaper = _Reaper()
        return _reaper


def new_tag() -> str:
    """A fresh token for ``ENV``: set it in the environment of what you start, then ``tag`` it."""
    return f"{os.getpid()}-{os.urandom(6).hex()}"


def tag(token: str) -> None:
    """Kill the processes whose environment carries ``NPUSIM_REAP=<token>`` once we are gone (or at
    ``sweep(token)``)."""
    _get().send(f"tag {token}")


def processes(token: str, pids) -> None:
    """Also kill these pids with ``token``'s processes (for processes whose environment cannot be read back:
    Ray's agents rewrite theirs with their process title). A pid is killed only while it names the same
    process (same start time), never a later process that reused the number."""
    r = _get()
    for pid in pids:
        start = start_time(pid)
        if start is not None:
            r.send(f"pid {token} {pid} {start}")


def path(directory: str, token: str = "-") -> None:
    """Remove ``directory`` (recursively) once we are gone, or at ``sweep(token)`` if a token is given."""
    _get().send(f"path {token} {os.path.abspath(directory)}")


def forget(directory: str) -> None:
    """We removed ``directory`` ourselves."""
    if _reaper is not None and _reaper.pid == os.getpid():
        _reaper.send(f"forget {os.path.abspath(directory)}")


def sweep(token: str) -> None:
    """Now, while we keep running: kill what carries ``token``, then remove the paths registered with it."""
    if _reaper is not None and _reaper.pid == os.getpid():
        _reaper.send(f"sweep {token}")


# ---------------------------------------------------------------------------------------- the reaper itself
def _tagged(tokens: set[str], me: int) -> list[int]:
    """Pids of our user's processes whose environment carries one of ``tokens``."""
    uid, found = os.getuid(), []
    needles = [f"{ENV}={t}\0".encode() for t in tokens]
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read() + b"\0"
        except OSError:
            continue
        if any(n in env for n in needles):
            found.append(int(name))
    return found


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, field 22 of /proc/<pid>/stat), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _clean(tokens: set[str], paths, parent: int, known=()) -> None:
    known = [pid for pid, start in known if start_time(pid) == start]
    if tokens or known:
        for _ in range(3):                      # a dying process may still start one: look again
            pids = [p for p in {*_tagged(tokens, os.getpid()), *known} if p != parent]
            known = []
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            deadline = time.monotonic() + 5
            while any(_alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.02)
    for p in sorted(paths, key=len, reverse=True):
        shutil.rmtree(p, ignore_errors=True)


def _main(fd: int, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C goes to the launcher, not to its janitor
    tokens: set[str] = set()
    paths: dict[str, str] = {}                       # directory -> token ("-": only at the end)
    pids: dict[str, list] = {}                       # token -> [(pid, start time)]
    buf = b""
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while True:
            chunk = pipe.read(65536)
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                cmd, _, arg = raw.decode(errors="replace").partition(" ")
                if cmd == "tag":
                    tokens.add(arg)
                elif cmd == "path":
                    token, _, directory = arg.partition(" ")
                    paths[directory] = token
                elif cmd == "pid":
                    token, pid, start = arg.split(" ")
                    pids.setdefault(token, []).append((int(pid), int(start)))
                elif cmd == "forget":
                    paths.pop(arg, None)
                elif cmd == "sweep" and arg in tokens:
                    mine = [d for d, t in paths.items() if t == arg]
                    _clean({arg}, mine, parent, pids.pop(arg, ()))
                    tokens.discard(arg)
                    for d in mine:
                        paths.pop(d, None)
    _clean(tokens, list(paths), parent, [p for token in pids.values() for p in token])


if __name__ == "__main__":
    _main(int(sys.argv[1]), int(sys.argv[2]))
