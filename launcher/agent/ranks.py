"""The rank processes a node agent starts: how one is described, started, and its output split into lines."""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import subprocess

from ..deathsig import die_with_parent
from ..forkserver import client as forkserver

STDOUT, STDERR = 1, 2
MAX_LINE = 1 << 20          # a "line" longer than this is emitted in pieces, so one rank cannot eat all memory
TAIL_LINES = 200            # stderr lines kept per rank for the failure summary


@dataclasses.dataclass(frozen=True)
class RankSpec:
    """How to start one rank: its full argv, environment and working directory."""

    rank: int
    local_rank: int
    argv: tuple
    env: dict
    cwd: str


class LineSplitter:
    """Turns the chunks read from one pipe into complete text lines; flush() yields a final partial line."""

    def __init__(self):
        self._buf = b""

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        while len(self._buf) > MAX_LINE:
            lines.append(self._buf[:MAX_LINE])
            self._buf = self._buf[MAX_LINE:]
        return [line.decode("utf-8", "replace") for line in lines]

    def flush(self) -> list[str]:
        """The unterminated tail, if any: a rank that dies mid-line still gets that text shown."""
        tail, self._buf = self._buf, b""
        return [tail.decode("utf-8", "replace")] if tail else []


class Forked:
    """A rank forked by the fork server (``launcher/forkserver/``), with what the agent uses of ``Popen``: ``pid``,
    its pipes as ``stdout``/``stderr``, and ``wait()`` — the exit status the server reported."""

    def __init__(self, server, spec: RankSpec, on_exit):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.returncode = None
        self._on_exit = on_exit
        try:
            self.pid = server.spawn(spec.argv, spec.env, spec.cwd, out_w, err_w, self._exited)
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        self.stdout, self.stderr = os.fdopen(out_r, "rb", buffering=0), os.fdopen(err_r, "rb", buffering=0)

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._on_exit(self)

    def wait(self):
        return self.returncode


def start(spec: RankSpec, on_exit):
    """Start one rank in its own session: forked from this process's fork server when the result is the same as a
    fresh interpreter (``on_exit(proc)`` is then called once the server reaped it), else a fresh ``python`` that
    dies with this process."""
    server = forkserver.server_for(spec.argv, spec.env) if os.path.isdir(spec.cwd) else None
    if server is not None:
        return Forked(server, spec, on_exit)
    return subprocess.Popen(list(spec.argv), env=spec.env, cwd=spec.cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=functools.partial(die_with_parent, os.getpid()))


class Rank:
    """One started rank process and the bookkeeping of its pipes."""

    def __init__(self, spec: RankSpec, attempt: int, proc):
        self.spec, self.attempt, self.proc = spec, attempt, proc
        # a Popen child's exit shows on its pidfd; a forked one's is reported by the fork server
        self.pidfd = os.pidfd_open(proc.pid) if isinstance(proc, subprocess.Popen) else None
        self.open_fds = {proc.stdout.fileno(): STDOUT, proc.stderr.fileno(): STDERR}
        self.splitters = {STDOUT: LineSplitter(), STDERR: LineSplitter()}
        self.tail = collections.deque(maxlen=TAIL_LINES)
        self.reaped = False
