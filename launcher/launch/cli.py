"""launch — run a script on N simulated NPU cards, one process per rank (torchrun for npusim).

Usage::

    launch [options] script.py [script args...]
    launch [options] -m package.module [module args...]
    python -m launcher [options] script.py [script args...]

Everything after the script (or module) name goes to the script untouched.

Options (torchrun's names; the underscored spellings such as ``--nproc_per_node`` work too):

  --nproc N, --nproc-per-node N   ranks per node (default: the config's cards per node; ``auto`` = same)
  --nnodes N                      number of nodes (default 1); rank r runs on node r // nproc, card r % nproc.
                                  On a Ray cluster each node is a Ray node offering NPU; on the embedded
                                  session the N nodes are simulated on this machine (own cards, rank-table
                                  server and node index each; collectives between them take the cross-node path)
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

import signal
import sys

from rt.errors import NpuError

from .. import cluster
from . import jobtrace
from .config import RunConfig, config_name
from .flags import UsageError, build_parser, config_from_args
from .job import JobResult, JobState, run
from .output import OutputRouter, failure_box, plain_box

# The docstring above is `launch --help`. This module parses the flags and reports how the job ended; the job loop
# that runs it is job.py.
EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT = 1, 2, 124


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


def report(rc: RunConfig, result: JobResult, router_summary) -> int:
    """Print the end-of-job summary and return launch's exit status."""
    if result.status == JobState.SUCCEEDED:
        return 0
    if result.status == JobState.FAILED:
        note = f"after {result.restarts} restart(s) (--max-restarts {rc.max_restarts})" if result.restarts else None
        router_summary(failure_box(rc.name, result.failures, note=note,
                                   diagnosis=jobtrace.box_lines(result)))
        return EXIT_FAILED
    ranks = ", ".join(map(str, result.running)) or "none"
    if result.status == JobState.TIMEOUT:
        router_summary(plain_box(rc.name, "TIMED OUT", [
            f"job exceeded --timeout {rc.timeout:g} s; ranks still running were stopped: {ranks}",
            *(jobtrace.box_lines(result) or [])]))
        return EXIT_TIMEOUT
    name = signal.Signals(result.signum).name if result.signum else "a signal"
    router_summary(plain_box(rc.name, "INTERRUPTED", [
        f"launch received {name}; stopped every rank (still running then: {ranks})"]))
    return 128 + (result.signum or signal.SIGINT)


def _cluster_command(argv: list[str]) -> int:
    """``launch --up [--config NAME]``, ``launch --down``, ``launch --status`` (the persistent local cluster)."""
    cmd, rest = argv[0], argv[1:]
    config = None
    if cmd == "--up" and len(rest) == 2 and rest[0] == "--config":
        config = rest[1]
    elif rest:
        print(f"launch: error: {cmd} takes {'only --config NAME' if cmd == '--up' else 'no arguments'}", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = config_name(config)
        return {"--up": lambda: cluster.up(config), "--down": cluster.down, "--status": cluster.status}[cmd]()
    except NpuError as e:
        print(f"launch: error: {e.message}", file=sys.stderr)
        return EXIT_USAGE
