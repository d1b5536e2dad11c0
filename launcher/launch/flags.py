"""`launch`'s flags: the parser (torchrun's names) and their translation into a validated RunConfig.

A bad value is one line ``launch: error: ...`` naming the flag and exit status 2, found before anything starts.
"""

from __future__ import annotations

import argparse
import math
import os

from .config import DEFAULT_GRACE, RunConfig, make_run_config


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is the one line ``launch: error: ...`` (no usage block) and exit 2."""

    def error(self, message):
        raise UsageError(message)


class UsageError(Exception):
    """A bad flag value found by argparse; main() prints it as one line."""


def _seconds(text: str) -> float:
    """A flag's number of seconds; '1e400' would become inf, so name the text as given."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: expected a finite number of seconds")
    return value


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    p = _Parser(prog="launch", description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
                                usage="launch [options] script.py [args...] | launch [options] -m module [args...]")
    p.add_argument("--nproc", "--nproc-per-node", "--nproc_per_node", dest="nproc", default=None,
                   help=argparse.SUPPRESS)
    p.add_argument("--nnodes", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--address", default=None, help=argparse.SUPPRESS)
    p.add_argument("--config", default=None, help=argparse.SUPPRESS)
    p.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", type=int, default=0,
                   help=argparse.SUPPRESS)
    p.add_argument("--log-dir", "--log_dir", dest="log_dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("-t", "--tee", type=int, default=3, help=argparse.SUPPRESS)
    p.add_argument("--local-ranks-filter", "--local_ranks_filter", dest="local_ranks_filter", default=None,
                   help=argparse.SUPPRESS)
    p.add_argument("--rank-table", "--rank_table", dest="rank_table", default=None, help=argparse.SUPPRESS)
    p.add_argument("--master-port", "--master_port", dest="master_port", type=int, default=None,
                   help=argparse.SUPPRESS)
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", default=None, help=argparse.SUPPRESS)
    p.add_argument("--profile", default=None, help=argparse.SUPPRESS)
    p.add_argument("--inject", default=None, help=argparse.SUPPRESS)
    p.add_argument("--race-check", "--race_check", dest="race_check", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=_seconds, default=None, help=argparse.SUPPRESS)
    p.add_argument("--grace-period", "--grace_period", dest="grace", type=_seconds, default=DEFAULT_GRACE,
                   help=argparse.SUPPRESS)
    p.add_argument("-m", "--module", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-cards", dest="no_cards", action="store_true", help=argparse.SUPPRESS)  # tests only
    p.add_argument("script", help=argparse.SUPPRESS)
    p.add_argument("script_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


def config_from_args(ns: argparse.Namespace) -> RunConfig:
    """Turn parsed flags into a validated RunConfig (AclError naming the bad flag)."""
    nproc = ns.nproc
    if nproc is not None:
        if nproc == "auto":
            nproc = None
        elif nproc.isascii() and nproc.isdigit() and len(nproc) <= 20:  # not '²' (isdigit, but not int-able)
            nproc = int(nproc)
    program = (["-m", ns.script] if ns.module else [ns.script]) + list(ns.script_args)
    env = dict(os.environ)
    if ns.race_check and env.get("NPUSIM_RACE_CHECK", "0") in ("", "0"):
        env["NPUSIM_RACE_CHECK"] = "1"
    return make_run_config(
        program, nproc=nproc, nnodes=ns.nnodes, address=ns.address or os.environ.get("RAY_ADDRESS"),
        config=ns.config, max_restarts=ns.max_restarts, log_dir=ns.log_dir, tee=ns.tee,
        local_ranks_filter=ns.local_ranks_filter, rank_table=ns.rank_table, timeout=ns.timeout,
        grace=ns.grace, cards=not ns.no_cards, master_addr=ns.master_addr, master_port=ns.master_port,
        profile=ns.profile, env=env, inject=ns.inject)
