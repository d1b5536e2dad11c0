"""Rank output in the launching process: `[rank<N>]:` prefixes, console filter, per-rank log files, and the boxed
failure summary printed when a job fails. (The node agent splits the ranks' pipes into lines: ``agent/ranks.py``.)
"""

from __future__ import annotations

import datetime
import signal
import sys
from pathlib import Path

from ..agent.ranks import STDOUT


class OutputRouter:
    """Writes rank lines to the launcher's console (prefixed, filtered) and to per-rank log files.

    Console: rank stdout lines go to our stdout, rank stderr lines to our stderr, each as
    ``[rank<N>]:<line>`` in arrival order; only local ranks in ``ranks_filter`` (None = all).
    Files: ``<log_dir>/rank<N>.log`` gets every line of the streams selected by ``tee`` (1 stdout,
    2 stderr, 3 both), unprefixed, whatever the console filter.
    """

    def __init__(self, nproc: int, ranks_filter=None, log_dir=None, tee: int = 3, stdout=None, stderr=None):
        self.nproc = nproc
        self.ranks_filter = ranks_filter
        self.tee = tee
        self.log_dir = Path(log_dir) if log_dir else None
        self._out = stdout or sys.stdout
        self._err = stderr or sys.stderr
        self._files: dict[int, object] = {}
        if self.log_dir:
            try:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                for old in self.log_dir.glob("rank*.log"):  # a new job starts with fresh files
                    old.unlink()
            except OSError as e:
                self._log_failed(e)

    def _file(self, rank: int):
        f = self._files.get(rank)
        if f is None:
            f = self._files[rank] = open(self.log_dir / f"rank{rank}.log", "a", encoding="utf-8")
        return f

    def _log_failed(self, error: OSError) -> None:
        """A log file cannot be written (a full disk, a quota, a vanished directory): say so once and go on
        without log files. The console output and the job itself are worth more than the copy on disk."""
        directory, self.log_dir = self.log_dir, None
        self.note(f"warning: cannot write the rank logs in --log-dir {directory} ({error.strerror or error}); "
                  "no more log files are written, the console output and the job go on")
        files, self._files = list(self._files.values()), {}
        for f in files:
            try:
                f.close()
            except OSError:  # the buffered tail that did not fit either
                pass

    def _log_lines(self, batch) -> None:
        try:
            for rank, stream, text in batch:
                if self.tee & stream:
                    self._file(rank).write(text + "\n")
            for f in self._files.values():
                f.flush()
        except OSError as e:
            self._log_failed(e)

    def lines(self, batch) -> None:
        """Route a batch of (rank, stream, text) tuples."""
        touched = set()
        for rank, stream, text in batch:
            if self.ranks_filter is None or rank % self.nproc in self.ranks_filter:
                target = self._out if stream == STDOUT else self._err
                target.write(f"[rank{rank}]:{text}\n")
                touched.add(target)
        for target in touched:
            target.flush()
        if self.log_dir:
            self._log_lines(batch)

    def note(self, text: str) -> None:
        """A message from the launcher itself, on stderr with a `launch:` prefix."""
        self._err.write(f"launch: {text}\n")
        self._err.flush()

    def mark_attempt(self, world_size: int, attempt: int) -> None:
        """Open every rank's file (one per rank, as torchrun: also for ranks that print nothing) and separate
        restarts inside them (the files are kept across attempts)."""
        if not self.log_dir:
            return
        try:
            for rank in range(world_size):
                f = self._file(rank)
                if attempt > 0:
                    f.write(f"---- launch: restart {attempt} (RESTART_COUNT={attempt}) ----\n")
                f.flush()
        except OSError as e:
            self._log_failed(e)

    def summary(self, text: str) -> None:
        self._err.write(text + "\n")
        self._err.flush()

    def close(self) -> None:
        try:
            for f in self._files.values():
                f.close()
        except OSError as e:
            self._log_failed(e)
        self._files.clear()


def describe_exit(returncode: int, pid: int) -> str:
    """'1 (pid: 123)' or '-9 (pid: 123): Signal 9 (SIGKILL) received by PID 123', as torchrun prints."""
    text = f"{returncode} (pid: {pid})"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        text += f"\n  error     : Signal {-returncode} ({name}) received by PID {pid}"
    return text


def traceback_tail(stderr_lines: list[str], limit: int = 40) -> list[str]:
    """The last Python traceback in a rank's stderr (from its 'Traceback' line), else its last lines."""
    start = None
    for i in range(len(stderr_lines) - 1, -1, -1):
        if stderr_lines[i].startswith("Traceback (most recent call last)"):
            start = i
            break
    lines = stderr_lines[start:] if start is not None else stderr_lines[-15:]
    if len(lines) > limit:
        lines = lines[:3] + [f"  ... ({len(lines) - limit + 3} lines omitted) ..."] + lines[-(limit - 4):]
    return lines


def _entry(index: int, failure: dict) -> list[str]:
    when = datetime.datetime.fromtimestamp(failure["time"]).strftime("%Y-%m-%d_%H:%M:%S")
    lines = [f"[{index}]:",
             f"  time      : {when}",
             f"  node      : {failure['node']} ({failure.get('host', '127.0.0.1')})",
             f"  rank      : {failure['rank']} (local_rank: {failure['local_rank']})",
             f"  exitcode  : {describe_exit(failure['returncode'], failure['pid'])}"]
    tail = traceback_tail(failure.get("stderr_tail", []))
    if tail:
        lines.append("  traceback :")
        lines += ["    " + line for line in tail]
    else:
        lines.append("  traceback : <nothing on stderr>")
    return lines


def failure_box(name: str, failures: list[dict], *, headline: str = "FAILED", note: str | None = None,
                diagnosis: list[str] | None = None) -> str:
    """The torchrun-style summary: root cause (first observed failure) first, then the others; then the flight
    recorder's diagnosis, when there is one."""
    width = 72
    root, others = failures[0], failures[1:]
    lines = ["=" * width, f"{name} {headline}", "-" * width]
    if note:
        lines += [note, "-" * width]
    lines.append("Failures:")
    if others:
        for i, failure in enumerate(others, start=1):
            lines += _entry(i, failure)
    else:
        lines.append("  <NO_OTHER_FAILURES>")
    lines += ["-" * width, "Root Cause (first observed failure):"] + _entry(0, root)
    if diagnosis:
        lines += ["-" * width, *diagnosis]
    lines.append("=" * width)
    return "\n".join(lines)


def plain_box(name: str, headline: str, body: list[str]) -> str:
    """A summary without failed ranks (timeout, interruption)."""
    width = 72
    return "\n".join(["=" * width, f"{name} {headline}", "-" * width, *body, "=" * width])

