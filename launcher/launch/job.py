"""The job loop of ``launch`` (also run by ``spawn`` and ``hccl-test``): place the job, run its attempts, restart,
tear everything down.

A job moves through :class:`JobState`, torchelastic's ``WorkerState`` in small. ``_Job.run`` is the one loop that
moves it, so the restart policy lives in one place: a failed attempt with restarts left (``--max-restarts``) starts
the whole group again, with fresh cards and ``RESTART_COUNT`` + 1::

    STARTING ──► RUNNING ──► SUCCEEDED
                    ├──────► FAILED ──(restarts left)──► RESTARTING ──► RUNNING
                    ├──────► TIMEOUT        (--timeout: the whole job's wall clock, restarts included)
                    └──────► INTERRUPTED    (SIGINT / SIGTERM / SIGHUP to launch)
"""

from __future__ import annotations

import dataclasses
import enum
import shutil
import signal
import tempfile
import threading
import time

from hccl import ranktable
from rt.constants import AclErrorCode
from rt.errors import AclError
from rt.host import reaper

from ..agent import RankSpec
from . import jobtrace
from .backends import make_backend
from .config import RunConfig, free_port, rank_env
from .output import OutputRouter, describe_exit

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_STOP_CODES = {-signal.SIGTERM, -signal.SIGKILL, 128 + signal.SIGTERM, 128 + signal.SIGKILL}


class JobState(enum.StrEnum):
    """Where a job is; the last four end it (``JobResult.status``)."""

    STARTING = "starting"           # placing the job: its session or cluster, node agents, rank table
    RUNNING = "running"             # an attempt's cards and ranks are up; the loop watches them
    RESTARTING = "restarting"       # the attempt failed and restarts are left
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"


@dataclasses.dataclass
class JobResult:
    """How a job ended. failures: the last attempt's failed ranks, root cause first."""

    status: JobState          # SUCCEEDED, FAILED, TIMEOUT or INTERRUPTED (a str: "succeeded", ...)
    job_id: str
    restarts: int             # restarts performed
    failures: list
    running: list             # ranks still running when a timeout or signal stopped the job
    signum: int | None = None
    diagnosis: list | None = None     # the flight-recorder analyzer's findings (hccl/trace.py)
    trace_dir: str | None = None      # where the ranks' dumps are (kept only with --log-dir)


def run(rc: RunConfig, *, router: OutputRouter | None = None, handle_signals: bool = False) -> JobResult:
    """Run a job to the end: place it, run attempts (restarting on failure), tear everything down.

    With handle_signals, SIGINT/SIGTERM/SIGHUP stop the job ("interrupted") instead of killing this
    process. Setup failures (unreachable cluster, too few cards) raise NpuError.
    """
    own_router = router is None
    router = router or OutputRouter(rc.nproc, rc.local_ranks_filter, rc.log_dir, rc.tee)
    stop, signums = threading.Event(), []
    previous = _install_handlers(stop, signums) if handle_signals else {}
    deadline = time.monotonic() + rc.timeout if rc.timeout else None
    tmp = tempfile.mkdtemp(prefix="npusim-launch-")
    reaper.path(tmp)                  # the rank table lives here: gone with us, however we end
    backend = None
    try:
        backend = make_backend(rc)
        if handle_signals:
            _install_handlers(stop, signums)  # ray.init installs its own SIGTERM handler: take it back
        return _Job(rc, backend, router, tmp, deadline, stop, signums).run()
    finally:
        try:
            if backend is not None:
                backend.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            reaper.forget(tmp)
            if own_router:
                router.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)


class _Job:
    """One job on its backend: ``run`` moves it from STARTING to a final state, one attempt at a time."""

    def __init__(self, rc: RunConfig, backend, router: OutputRouter, tmp: str, deadline, stop, signums):
        self.rc, self.backend, self.router, self.tmp = rc, backend, router, tmp
        self.deadline, self.stop, self.signums = deadline, stop, signums
        self.job_id = backend.new_job_id()
        self.table = _write_rank_table(rc.rank_table or f"{tmp}/rank_table.json", rc)
        self.trace_env = jobtrace.rank_env(rc, tmp)
        self.ended: dict[int, object] = {}     # this attempt's ranks that ended: exit code, or "stopped" by us

    def run(self) -> JobResult:
        state, attempt, failures, running = JobState.STARTING, 0, [], []
        while True:
            if state in (JobState.STARTING, JobState.RESTARTING):
                jobtrace.clear(self.trace_env)      # dumps of an earlier attempt are not this one's
                state, failures, running = self._attempt(attempt)
            elif state is JobState.FAILED and attempt < self.rc.max_restarts:
                root = failures[0]
                self.router.note(f"rank {root['rank']} failed (exit code {describe_exit(root['returncode'], root['pid'])}"
                                 f"); restarting all {self.rc.world_size} ranks (restart {attempt + 1} of "
                                 f"{self.rc.max_restarts})")
                state, attempt = JobState.RESTARTING, attempt + 1
            else:
                return self._result(state, attempt, failures, running)

    def _result(self, state: JobState, attempt: int, failures: list, running: list) -> JobResult:
        result = JobResult(state, self.job_id, attempt, failures, running, self.signums[0] if self.signums else None)
        dumps = self.trace_env["NPUSIM_TRACE_DUMP_DIR"]
        if state is not JobState.SUCCEEDED:
            result.diagnosis = jobtrace.diagnose(dumps, self.rc.world_size, self.ended)
            result.trace_dir = None if dumps.startswith(self.tmp) else dumps
        if self.rc.profile:
            jobtrace.write_profile(self.rc, self.trace_env["NPUSIM_PROFILE_DIR"], self.router)
        return result

    def _attempt(self, attempt: int) -> tuple[JobState, list, list]:
        """One attempt: fresh cards, every rank started, watched until it ends (RUNNING), everything stopped and
        the cards given back. Returns how it ended, its failed ranks (first failure first) and those still running."""
        rc, backend = self.rc, self.backend
        card_job = self.job_id if attempt == 0 else f"{self.job_id}r{attempt}"   # fresh card names for a restart
        node_env = [dict(extra, **self.trace_env) for extra in backend.prepare(card_job)]
        host0 = rc.master_addr or ("127.0.0.1" if rc.nnodes == 1 else backend.hosts[0])
        master = (host0, rc.master_port or free_port())    # torch's env:// store: rank 0 listens there
        specs = [[RankSpec(rank, rc.local_rank_of(rank), (rc.python, "-u", *rc.program),
                           rank_env(rc, rank, job_id=self.job_id, attempt=attempt, rank_table_file=self.table,
                                    node_extra=node_env[node], master=master), rc.cwd)
                  for rank in range(node * rc.nproc, (node + 1) * rc.nproc)]
                 for node in range(rc.nnodes)]
        self.router.mark_attempt(rc.world_size, attempt)
        self.ended = {}
        state, failures, running = JobState.INTERRUPTED, [], set(range(rc.world_size))
        try:
            if not self.stop.is_set():  # else a signal arrived while the cluster or the cards were being set up
                backend.start(specs, attempt)
                state = self._watch(attempt, running, failures)
        finally:
            backend.stop(rc.grace)
            # Ranks that failed on their own before the stop signal reached them are failures too.
            self._drain(attempt, failures)
            backend.release()
        failures.sort(key=lambda f: f["time"])
        for f in failures:
            f["host"] = backend.hosts[f["node"]]
        return state, failures, sorted(running)

    def _watch(self, attempt: int, running: set, failures: list) -> JobState:
        """RUNNING: route the ranks' output until every rank exited, one failed, the deadline passed or a signal
        came."""
        while running:
            if self.stop.is_set():
                return JobState.INTERRUPTED
            wait = 0.2
            if self.deadline is not None:
                wait = min(wait, self.deadline - time.monotonic())
                if wait <= 0:
                    return JobState.TIMEOUT
            self._take(self.backend.poll(wait), attempt, running, failures, stopped_ok=False)
            if failures:
                return JobState.FAILED
        return JobState.SUCCEEDED

    def _drain(self, attempt: int, failures: list, limit: float = 5.0) -> None:
        end = time.monotonic() + limit
        while time.monotonic() < end:
            results = self.backend.poll(0.05)
            if not results:
                return
            self._take(results, attempt, set(), failures, stopped_ok=True)

    def _take(self, results, attempt: int, running: set, failures: list, stopped_ok: bool) -> None:
        for result in results:
            self.router.lines(result["lines"])
            for ex in result["exits"]:
                if ex["attempt"] != attempt:
                    continue
                running.discard(ex["rank"])
                # While we stop the group, a rank ended by our signal is not a failure; one that failed on its
                # own (raised, exited non-zero) before the signal reached it still is.
                stopped = stopped_ok and ex["stopped"] and ex["returncode"] in _STOP_CODES
                self.ended[ex["rank"]] = "stopped" if stopped else ex["returncode"]
                if ex["returncode"] != 0 and not stopped:
                    failures.append(ex)


def _write_rank_table(path: str, rc: RunConfig) -> str:
    try:
        return ranktable.write(path, ranktable.build(rc.nnodes, rc.nproc, device_ids=rc.devices))
    except OSError as e:  # a full disk, a directory put there since the flags were checked
        raise AclError(AclErrorCode.ACL_ERROR_WRITE_FILE,
                       f"launch: cannot write the rank table {path}: {e.strerror or e}") from None


def _install_handlers(stop: threading.Event, signums: list):
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum, frame):
        signums.append(signum)
        stop.set()

    return {s: signal.signal(s, handler) for s in HANDLED_SIGNALS}
