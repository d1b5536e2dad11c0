"""hccl-test — nccl-tests-style bandwidth and correctness runs of every collective on N ranks.

Usage::

    hccl-test all_reduce -p 8 -b 1K -e 64M -f 4 -d fp32 -o sum -n 20 -w 5 -c 1
    hccl-test broadcast -p 8 -b 16M -e 16M -r 3 --json
    python -m launcher.tools.hccl_test all_gather -p 4 -b 1K -e 1M --csv -F /tmp/ag.csv

Collectives: all_reduce, broadcast, reduce, all_gather, reduce_scatter, scatter, all_to_all,
send_recv (every rank sends to rank+1 and receives from rank-1, one batch_send_recv) and barrier.

The command starts N rank processes through the launcher's job loop, in its own process (as ``launch --nproc N``:
an embedded local Ray session unless ``--address``), each running the rank body ``hccl/perf.py``. Each rank allocates its buffers on its own card once, at the
largest size; as nccl-tests' TimeTest, the ranks then line up on a barrier and run ``-w`` calls at the largest
size and ``-w`` at the smallest before the sweep (a process's first collectives are slower than the rest); then
for every size each rank fills its input with a rank-dependent pattern, runs ``-w``
warm-up calls, ``-n`` timed calls out of place and ``-n`` in place (each call = enqueue + stream
synchronize, timed with the host clock), then ``-c`` checked calls per placement whose output is
compared element by element with a numpy oracle. Ranks line up with a barrier before each timed
loop.

Columns are those of nccl-tests. ``time`` is the **max over ranks of each rank's median** of the
``-n`` calls (nccl-tests reports the mean over iterations averaged over ranks; the median resists
the noise of an oversubscribed laptop, the max is what the slowest rank saw). ``size`` is the
whole buffer in bytes (for all_gather, reduce_scatter, scatter and all_to_all the per-rank block ×
ranks, rounded down to a multiple of ranks, as nccl-tests does); ``algbw = size / time``,
``busbw = algbw × factor`` with the nccl-tests factors: all_reduce 2(n-1)/n; all_gather,
reduce_scatter, scatter, all_to_all (n-1)/n; broadcast, reduce, send_recv 1. ``#wrong`` sums
wrong elements over ranks and checked calls. HCCL's broadcast is in place by definition, and
in-place all_to_all / send_recv are not defined by HCCL, so those groups print N/A.

Output: the nccl-tests preamble and table (rank 0's lines, unprefixed); ``--csv`` or ``--json``
print machine-readable rows instead; ``-F PATH`` also writes them to PATH (JSON if PATH ends in
``.json``, else CSV). Exit status: 0 all correct, 1 wrong results or a failed rank, 2 bad arguments.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import tempfile

from hccl.perf import build_parser, check_args
from rt.errors import NpuError

from ..agent.ranks import STDOUT
from ..launch.config import make_run_config, output_path
from ..launch.job import JobState, run
from ..launch.output import OutputRouter

CSV_FIELDS = ("collective", "nranks", "size", "count", "type", "redop", "root", "placement", "time_us", "algbw",
              "busbw", "wrong")


def to_csv(doc: dict) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for row in doc["rows"]:
        for placement in ("out_of_place", "in_place"):
            g = row[placement]
            if g is not None:
                w.writerow([doc["collective"], doc["nranks"], row["size"], row["count"], row["type"], row["redop"],
                            row["root"], placement, f"{g['time_us']:.3f}", f"{g['algbw']:.6f}", f"{g['busbw']:.6f}",
                            "" if g["wrong"] is None else g["wrong"]])
    return out.getvalue()


def worker_argv(argv: list[str], result_file: str) -> list[str]:
    return list(argv) + ["--_result", result_file]


def main(argv: list[str] | None = None) -> int:
    """The ``hccl-test`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    parser.error = _usage_error           # one line, as launch's usage errors (no usage block)
    try:
        ns = parser.parse_args(argv)
        check_args(parser, ns)
        if ns.output_file is not None:  # a bad -F must fail now, not after the whole run
            ns.output_file = output_path("-F", ns.output_file)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    except NpuError as e:
        print(f"hccl-test: error: {e.message}", file=sys.stderr)
        return 2
    return launch_ranks(ns, argv)


def _usage_error(message: str):
    print(f"hccl-test: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def launch_ranks(ns, argv: list[str]) -> int:
    """Start the ranks through the launcher; rank 0's stdout is the table, unprefixed."""

    class TableRouter(OutputRouter):
        """Rank 0's stdout passes through as is (it is the report); everything else keeps its prefix."""

        def lines(self, batch) -> None:
            rest = []
            for rank, stream, line in batch:
                if rank == 0 and stream == STDOUT:
                    self._out.write(line + "\n")
                else:
                    rest.append((rank, stream, line))
            self._out.flush()
            if rest:
                super().lines(rest)

    with tempfile.TemporaryDirectory(prefix="hccl-test-") as tmp:
        result_file = os.path.join(tmp, "result.json")
        try:
            rc = make_run_config(("-m", "hccl.perf", *worker_argv(argv, result_file)), nproc=ns.nproc,
                                 nnodes=ns.nnodes, config=ns.config,
                                 address=ns.address or os.environ.get("RAY_ADDRESS"),
                                 timeout=ns.timeout, name=f"hccl-test {ns.collective}")
        except NpuError as e:  # bad -p / --nnodes / --config / --timeout: a usage error
            print(f"hccl-test: error: {e.message}", file=sys.stderr)
            return 2
        try:
            router = TableRouter(rc.nproc)
            result = run(rc, router=router, handle_signals=True)
        except NpuError as e:
            print(f"hccl-test: error: {e.message}", file=sys.stderr)
            return 1
        if result.status != JobState.SUCCEEDED or not os.path.exists(result_file):
            failed = ", ".join(f"rank {f['rank']} ({f['returncode']})" for f in result.failures) or result.status
            print(f"hccl-test: {ns.collective} did not complete: {failed}", file=sys.stderr)
            return 1
        with open(result_file, encoding="utf-8") as f:
            doc = json.load(f)
    if ns.format == "json":
        print(json.dumps(doc, indent=1))
    elif ns.format == "csv":
        print(to_csv(doc), end="")
    if ns.output_file:
        try:
            with open(ns.output_file, "w", encoding="utf-8") as f:
                f.write(json.dumps(doc, indent=1) if ns.output_file.endswith(".json") else to_csv(doc))
        except OSError as e:  # a full disk, or the directory went away during the run
            print(f"hccl-test: error: cannot write -F {ns.output_file}: {e.strerror or e}", file=sys.stderr)
            return 1
    return 0 if doc["wrong_total"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
