"""launch — run a script on N simulated NPU cards, one process per rank (torchrun for npusim).

Usage::

    launch [options] script.py [script args...]
    launch [options] -m package.module [module args...]
    python -m launcher [options] script.py [script args...]

Everything after the script (or module) name goes to the script untouched.

Options (torchrun's names; the underscored spellings such as ``--nproc_per_node`` work too):

  --nproc N, --nproc-per-node N   ranks per node (default: the config's cards per node; ``auto`` = same)
  --nnodes N                      number of nodes (default 1); rank r runs on node r // nproc, card r % nproc
  --address HOST:PORT             join this Ray cluster (default: $RAY_ADDRESS, else an embedded local
                                  session on 127.0.0.1 that launch starts and stops)
  --config NAME|FILE              simulated hardware, e.g. ``default``, ``small``, ``configs/ascend910b.toml``
  --max-restarts N                restart the whole rank group up to N times after a failure (default 0)
  --log-dir DIR                   write ``DIR/rank<N>.log`` per rank (kept across restarts, fresh per job); if
                                  the files cannot be written (a full disk), launch says so once and goes on
                                  without them: the console output and the job are not affected
  --tee {0,1,2,3}                 streams copied into the --log-dir files: 1 stdout, 2 stderr, 3 both (default 3)
  --local-ranks-filter 0,3        only these local ranks reach the console (log files get everything)
  --rank-table PATH               write the job's rank table there (default: the job's temp dir)
  --master-port PORT              MASTER_PORT for torch's env:// rendezvous (default: a free port per attempt)
  --master-addr HOST              MASTER_ADDR (default 127.0.0.1; node 0's host with --nnodes > 1)
  --race-check                    run every rank with the stream race detector on (NPUSIM_RACE_CHECK=1: races are
                                  warnings; set NPUSIM_RACE_CHECK=raise to make the next synchronize raise
                                  rt.RaceError instead; docs/races.md)
  --profile FILE                  write the job's timeline there (Chrome trace / Perfetto JSON: a track per
                                  rank, per card stream, memory counters, flows; docs/tracing.md)
  --inject SPEC                   inject faults to test recovery code: every rank gets NPUSIM_FAULTS=SPEC, e.g.
                                  ``kill:rank=1:collective=3`` (SIGKILL rank 1 as it enters its 3rd collective);
                                  ``;``-separated faults: kill, kill_card, hang, delay, fail, corrupt, oom, ecc,
                                  each with ``restart=N`` (default 0, so a --max-restarts rerun runs clean). A
                                  malformed SPEC, or a rank or card the job lacks, is a usage error (docs/faults.md)

When a job fails (or times out), every rank's flight recorder is dumped (``trace_rank<N>.json`` in --log-dir,
or $NPUSIM_TRACE_DUMP_DIR, else a directory of launch's own) and the failure box ends with the analyzer's
diagnosis (``python -m hccl.trace DIR`` prints it again from kept dumps).

The persistent local cluster
  launch --up [--config NAME]     start a local session whose cards stay booted (a daemon); every launch and
                                  spawn on this machine then borrows its warm cards (and says so in one line)
                                  instead of starting Ray and booting cards. NPUSIM_CLUSTER=0 ignores it.
  launch --down                   stop it;  launch --status: one line about it
  --timeout SECONDS               wall-clock limit for the whole job, restarts included
  --grace-period SECONDS          SIGTERM → SIGKILL delay when stopping ranks (default 5, at most 3600)
  -m, --module                    run the target as ``python -m module``

What each rank gets
  A separate OS process ``python -u script args`` (or ``-m module``) running the target as
  ``__main__``, in launch's working directory, in its own session (process group), placed on the Ray
  node of its card. Environment (on top of launch's own):

  ======================  ================================================================
  RANK, RANK_ID           global rank, 0 .. WORLD_SIZE-1
  LOCAL_RANK              rank on its node; also the card index:
  DEVICE_ID,              = LOCAL_RANK (``rt.set_device(int(os.environ["DEVICE_ID"]))``)
  ASCEND_DEVICE_ID
  WORLD_SIZE, RANK_SIZE   total ranks (nproc * nnodes)
  LOCAL_WORLD_SIZE        ranks per node (nproc)
  NODE_RANK, GROUP_RANK   node index
  RANK_TABLE_FILE         the job's rank table (HCCL JSON v1.0: one server per node)
  RESTART_COUNT           0 on the first run, k after the k-th restart; MAX_RESTARTS as given
  MASTER_ADDR,            torch's env:// rendezvous: 127.0.0.1 (node 0's host with --nnodes > 1) and a
  MASTER_PORT             free port, or --master-addr / --master-port; rank 0's init_process_group listens there
  OMP_NUM_THREADS         1 unless already set (as torchrun)
  PYTHONPATH              the npusim source root appended, so ranks import the same rt/hccl (a real pyACL
                          on the PYTHONPATH you give still comes first)
  NPUSIM_JOB              job id (the card actors' names contain it)
  NPUSIM_NODE             node index
  NPUSIM_CARD_DIR         directory of this node's card sockets (how rt reaches the cards; a rank
                          is not a Ray driver)
  NPUSIM_CONFIG           the resolved config file
  NPUSIM_RAY_ADDRESS      the Ray GCS address (127.0.0.1:<port> for the embedded session), for a rank
                          that wants to use Ray itself; RAY_AUTH_* passed along with it
  ======================  ================================================================

  ``hccl.init()`` builds the world communicator from this environment.

  With ASCEND_RT_VISIBLE_DEVICES set (CANN's parsing: ascending ids, renumbered from 0), the job uses
  those cards: ``--nproc`` defaults to how many are visible, local rank i runs on the i-th visible card
  (device i in the rank, the physical id in the rank table), and asking for more ranks than visible cards
  is refused.

Output
  Every stdout/stderr line of every rank reaches launch's stdout/stderr as ``[rank<N>]:<line>``
  in arrival order; a line a rank was writing when it died is still shown. Nothing is dropped:
  a rank that prints faster than the console drains is slowed down instead.

Failures, restarts, signals
  When a rank exits non-zero or is killed, every other rank's process group gets SIGTERM and,
  after --grace-period, SIGKILL. With restarts left the whole group starts again with fresh cards
  and RESTART_COUNT+1; otherwise launch prints a summary box (root cause = first failed rank, its
  node, exit code or signal, and the tail of its traceback taken from its stderr — no decorator
  needed) and exits 1. Ctrl-C / SIGTERM / SIGHUP to launch stop everything the same way. When
  launch returns, no rank process, node agent, card actor, Ray process it started, shared-memory
  segment or temp file is left: ranks also die with their agent (PR_SET_PDEATHSIG), and a reaper process
  removes the rest even when launch itself is killed with SIGKILL (docs/security.md).
  A script that does not compile is reported at once, before Ray or any card starts.

Exit status
  0 all ranks succeeded · 1 a rank failed (or setup failed at run time) · 2 bad arguments or config ·
  124 --timeout reached · 128+N stopped by signal N (130 for Ctrl-C).

Python API: ``launcher.spawn(fn, nproc=8, args=())`` runs ``fn(*args)`` on every rank the same way
and returns the per-rank results (see ``launcher/spawn.py``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

from hccl import ranktable
from rt.constants import AclErrorCode
from rt.errors import AclError, NpuError
from rt.host import reaper

from .agent import RankSpec
from .local_backend import LocalBackend
from . import jobtrace
from .config import RunConfig, free_port, rank_env
from .flags import UsageError, build_parser, config_from_args
from .output import OutputRouter, describe_exit, failure_box, plain_box

EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT = 1, 2, 124
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclasses.dataclass
class JobResult:
    """How a job ended. failures: the last attempt's failed ranks, root cause first."""

    status: str               # "succeeded" | "failed" | "timeout" | "interrupted"
    job_id: str
    restarts: int             # restarts performed
    failures: list
    running: list             # ranks still running when a timeout or signal stopped the job
    signum: int | None = None
    diagnosis: list | None = None     # the flight-recorder analyzer's findings (hccl/trace.py)
    trace_dir: str | None = None      # where the ranks' dumps are (kept only with --log-dir)


_told_cluster = False


def _make_backend(rc: RunConfig):
    if not rc.cards:
        return LocalBackend(rc)
    backend = _cluster_backend(rc)
    if backend is not None:
        return backend
    from .ray_backend import RayBackend  # imports Ray: only when cards are wanted
    return RayBackend(rc)


def _cluster_backend(rc: RunConfig):
    """The persistent local cluster's backend (``launch --up``) when it is up and fits the job, else None."""
    global _told_cluster
    from .ray_backend import _ray_initialized
    if rc.nnodes != 1 or rc.address or _ray_initialized() or os.environ.get("NPUSIM_CLUSTER", "1") == "0":
        return None
    from . import cluster
    info = cluster.find()
    if info is None:
        return None
    if info.get("config") != rc.hw.to_dict():
        print(f"npusim: the local cluster (pid {info['pid']}) runs config {info['config_path']}, this job asks "
              f"for {rc.hw.path}: starting an embedded session instead", file=sys.stderr)
        return None
    if not _told_cluster:
        print(f"npusim: using the local cluster (pid {info['pid']}, started by `launch --up`)", file=sys.stderr)
        _told_cluster = True
    from .cluster_backend import ClusterBackend
    return ClusterBackend(rc, info)


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
        backend = _make_backend(rc)
        if handle_signals:
            _install_handlers(stop, signums)  # ray.init installs its own SIGTERM handler: take it back
        job_id = backend.new_job_id()
        table = _write_rank_table(rc.rank_table or f"{tmp}/rank_table.json", rc)
        seen = jobtrace.rank_env(rc, tmp)
        for attempt in range(rc.max_restarts + 1):
            jobtrace.clear(seen)
            status, failures, running = _run_attempt(rc, backend, router, job_id, attempt, table, deadline, stop,
                                                     seen)
            for f in failures:
                f["host"] = backend.hosts[f["node"]]
            if status == "failed" and attempt < rc.max_restarts:
                root = failures[0]
                router.note(f"rank {root['rank']} failed (exit code {describe_exit(root['returncode'], root['pid'])}"
                            f"); restarting all {rc.world_size} ranks (restart {attempt + 1} of {rc.max_restarts})")
                continue
            signum = signums[0] if signums else None
            result = JobResult(status, job_id, attempt, failures, running, signum)
            if status != "succeeded":
                result.diagnosis = jobtrace.diagnose(seen["NPUSIM_TRACE_DUMP_DIR"], rc.world_size)
                result.trace_dir = seen["NPUSIM_TRACE_DUMP_DIR"] if not seen["NPUSIM_TRACE_DUMP_DIR"].startswith(tmp) \
                    else None
            if rc.profile:
                jobtrace.write_profile(rc, seen["NPUSIM_PROFILE_DIR"], router)
            return result
        raise AssertionError("unreachable: the last attempt always returns")
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


def _write_rank_table(path: str, rc: RunConfig) -> str:
    try:
        return ranktable.write(path, ranktable.build(rc.nnodes, rc.nproc, device_ids=rc.devices))
    except OSError as e:  # a full disk, a directory put there since the flags were checked
        raise AclError(AclErrorCode.ACL_ERROR_WRITE_FILE,
                       f"launch: cannot write the rank table {path}: {e.strerror or e}") from None


def _run_attempt(rc, backend, router, job_id, attempt, table, deadline, stop, trace_env=None):
    node_env = backend.prepare(job_id, attempt)
    node_env = [dict(extra, **(trace_env or {})) for extra in node_env]
    host0 = rc.master_addr or ("127.0.0.1" if rc.nnodes == 1 else backend.hosts[0])
    master = (host0, rc.master_port or free_port())    # torch's env:// store: rank 0 listens there
    specs = [[RankSpec(rank, rc.local_rank_of(rank), (rc.python, "-u", *rc.program),
                       rank_env(rc, rank, job_id=job_id, attempt=attempt, rank_table_file=table,
                                node_extra=node_env[node], master=master), rc.cwd)
              for rank in range(node * rc.nproc, (node + 1) * rc.nproc)]
             for node in range(rc.nnodes)]
    router.mark_attempt(rc.world_size, attempt)
    status, failures, running = "interrupted", [], set(range(rc.world_size))
    try:
        if stop.is_set():  # a signal arrived while the cluster or the cards were being set up
            return status, failures, sorted(running)
        backend.start(specs, attempt)
        status = _watch(backend, router, attempt, running, failures, deadline, stop)
    finally:
        backend.stop(rc.grace)
        # Ranks that failed on their own before the stop signal reached them are failures too.
        _drain(backend, router, attempt, failures)
        backend.release()
    failures.sort(key=lambda f: f["time"])
    return status, failures, sorted(running)


_STOP_CODES = {-signal.SIGTERM, -signal.SIGKILL, 128 + signal.SIGTERM, 128 + signal.SIGKILL}


def _take(results, router, attempt, running, failures, stopped_ok):
    for result in results:
        router.lines(result["lines"])
        for ex in result["exits"]:
            if ex["attempt"] != attempt:
                continue
            running.discard(ex["rank"])
            # While we stop the group, a rank ended by our signal is not a failure; one that failed on its
            # own (raised, exited non-zero) before the signal reached it still is.
            stopped = stopped_ok and ex["stopped"] and ex["returncode"] in _STOP_CODES
            if ex["returncode"] != 0 and not stopped:
                failures.append(ex)


def _watch(backend, router, attempt, running, failures, deadline, stop) -> str:
    while running:
        if stop.is_set():
            return "interrupted"
        wait = 0.2
        if deadline is not None:
            wait = min(wait, deadline - time.monotonic())
            if wait <= 0:
                return "timeout"
        _take(backend.poll(wait), router, attempt, running, failures, stopped_ok=False)
        if failures:
            return "failed"
    return "succeeded"


def _drain(backend, router, attempt, failures, limit: float = 5.0) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        results = backend.poll(0.05)
        if not results:
            return
        _take(results, router, attempt, set(), failures, stopped_ok=True)


def _install_handlers(stop: threading.Event, signums: list):
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum, frame):
        signums.append(signum)
        stop.set()

    return {s: signal.signal(s, handler) for s in HANDLED_SIGNALS}


def report(rc: RunConfig, result: JobResult, router_summary) -> int:
    """Print the end-of-job summary and return launch's exit status."""
    if result.status == "succeeded":
        return 0
    if result.status == "failed":
        note = f"after {result.restarts} restart(s) (--max-restarts {rc.max_restarts})" if result.restarts else None
        router_summary(failure_box(rc.name, result.failures, note=note,
                                   diagnosis=jobtrace.box_lines(result)))
        return EXIT_FAILED
    ranks = ", ".join(map(str, result.running)) or "none"
    if result.status == "timeout":
        router_summary(plain_box(rc.name, "TIMED OUT", [
            f"job exceeded --timeout {rc.timeout:g} s; ranks still running were stopped: {ranks}",
            *(jobtrace.box_lines(result) or [])]))
        return EXIT_TIMEOUT
    name = signal.Signals(result.signum).name if result.signum else "a signal"
    router_summary(plain_box(rc.name, "INTERRUPTED", [
        f"launch received {name}; stopped every rank (still running then: {ranks})"]))
    return 128 + (result.signum or signal.SIGINT)


def main(argv: list[str] | None = None) -> int:
    """The `launch` command; returns the exit status (the console script passes it to sys.exit)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("--up", "--down", "--status"):
        return _cluster_command(argv)
    parser = build_parser(__doc__)
    try:
        ns = parser.parse_args(argv)
        rc = config_from_args(ns)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    except (UsageError, NpuError) as e:
        print(f"launch: error: {getattr(e, 'message', e)}", file=sys.stderr)
        return EXIT_USAGE
    router = OutputRouter(rc.nproc, rc.local_ranks_filter, rc.log_dir, rc.tee)
    try:
        result = run(rc, router=router, handle_signals=True)
        return report(rc, result, router.summary)
    except NpuError as e:  # the job could not be set up or run: the summary box, as for a failed rank
        router.summary(plain_box(rc.name, "FAILED", [f"launch: error: {e.message}"]))
        return EXIT_FAILED
    finally:
        router.close()


def _cluster_command(argv: list[str]) -> int:
    """``launch --up [--config NAME]``, ``launch --down``, ``launch --status`` (the persistent local cluster)."""
    from . import cluster
    cmd, rest = argv[0], argv[1:]
    config = None
    if cmd == "--up" and len(rest) == 2 and rest[0] == "--config":
        config = rest[1]
    elif rest:
        print(f"launch: error: {cmd} takes {'only --config NAME' if cmd == '--up' else 'no arguments'}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return {"--up": lambda: cluster.up(config), "--down": cluster.down, "--status": cluster.status}[cmd]()
    except NpuError as e:
        print(f"launch: error: {e.message}", file=sys.stderr)
        return EXIT_USAGE
