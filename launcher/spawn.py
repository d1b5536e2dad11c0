"""``launcher.spawn(fn, nproc=8, args=())``: run ``fn(*args)`` on every rank, return the results in rank order.

This is how distributed tests are written::

    def check_all_reduce(n):                 # module level, in a test module or a script
        comm = hccl.init()
        ...
        return value

    def test_all_reduce():
        assert launcher.spawn(check_all_reduce, nproc=4, args=(10,)) == [expected] * 4

Each rank is a process started exactly as ``launch`` starts one (same environment, cards, output
prefixes, failure handling). ``fn`` travels by reference — its module's file and qualified name — and
each rank re-imports that module (``launcher/spawned.py``; a script's ``__main__`` is loaded as ``__mp_main__``, as
multiprocessing does, so its ``if __name__ == "__main__":`` block does not run again). ``args`` and
the return values travel as pickles through the job's private temp dir, written only by our own
processes. A failure raises ``LaunchError`` naming every failed rank with its exception type,
message and traceback (or its exit code / signal and stderr tail if it died without one).

``spawn`` reuses the caller's Ray session if one is initialised (e.g. a session-scoped fixture),
otherwise starts and stops an embedded one per call; nothing is left behind between calls.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from rt.args import acl_param, instance, sequence, text
from rt.host import reaper

from . import spawned
from .launch.config import DEFAULT_GRACE, make_run_config
from .launch.job import JobState, run
from .launch.output import describe_exit, traceback_tail

_SPAWN_DIR = "NPUSIM_SPAWN_DIR"


class LaunchError(RuntimeError):
    """A spawned job failed. ``failures``: one dict per failed rank (rank, node, returncode, type,
    message, traceback); ``status``: 'failed', 'timeout' or 'interrupted'."""

    def __init__(self, message: str, failures: list, status: str = "failed", diagnosis: list | None = None):
        super().__init__(message)
        self.failures = failures
        self.status = status
        self.diagnosis = diagnosis or []      # the flight recorder's findings (hccl/trace.py), if any


def function_reference(fn) -> dict:
    """Module file + qualified name by which a rank can re-import fn; refuses what cannot be re-imported."""
    qualname, module_name = getattr(fn, "__qualname__", None), getattr(fn, "__module__", None)
    if not callable(fn) or not qualname or not module_name:
        raise acl_param(f"spawn: fn must be a module-level function, got {fn!r}")
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise acl_param(f"spawn: fn {module_name}.{qualname} is a lambda or nested function; ranks re-import "
                        "fn by name, so define it at module level")
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if not file:
        raise acl_param(f"spawn: fn's module {module_name!r} has no source file (interactive session?); "
                        "define fn in a script or module")
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if obj is not fn:
        raise acl_param(f"spawn: {module_name}.{qualname} does not name fn in its module; ranks re-import fn "
                        "by that name, so it must be reachable there")
    return {"module": module_name, "file": str(Path(file).resolve()), "qualname": qualname}


def spawn(fn, nproc: int = 8, args=(), *, nnodes: int = 1, config=None, address=None, max_restarts: int = 0,
          timeout: float | None = None, log_dir=None, local_ranks_filter=None, grace: float = DEFAULT_GRACE,
          env: dict | None = None, profile: str | None = None, inject: str | None = None,
          _no_cards: bool = False) -> list:
    """Run fn(*args) on nproc * nnodes ranks; return their results in rank order, or raise LaunchError.

    Options are those of ``launch`` (nnodes, config, address, max_restarts, timeout, log_dir,
    local_ranks_filter, grace, profile: the job's timeline as Chrome-trace JSON, inject: a fault spec every
    rank gets as ``NPUSIM_FAULTS``, docs/faults.md) plus ``env``, extra environment for every rank. A
    LaunchError carries the flight recorder's ``diagnosis``. A bad argument (wrong type, out of range: nproc
    1..64, nnodes 1..1024, timeout a finite number of seconds, grace 0..3600, env a dict of str) is
    AclError(ACL_ERROR_INVALID_PARAM) naming it, before anything starts.
    """
    if os.environ.get(_SPAWN_DIR):
        raise acl_param("spawn called inside a spawned rank (the module that defines fn calls spawn at import "
                        "time?); guard the call with `if __name__ == \"__main__\":` or put it in a test function")
    ref = function_reference(fn)
    _check_arguments(args, address, env)
    try:
        payload = pickle.dumps(tuple(args))
    except Exception as e:
        raise acl_param(f"spawn: args of {ref['qualname']} cannot be pickled: {type(e).__name__}: {e}") from None
    with tempfile.TemporaryDirectory(prefix="npusim-spawn-") as workdir:
        name = f"spawn({ref['module']}.{ref['qualname']})"
        rc = make_run_config(("-c", spawned.BOOT, workdir), name=name, nproc=nproc, nnodes=nnodes, config=config,
                             address=address, max_restarts=max_restarts, timeout=timeout, log_dir=log_dir,
                             local_ranks_filter=local_ranks_filter, grace=grace, cards=not _no_cards,
                             env={**os.environ, **(env or {}), _SPAWN_DIR: workdir}, profile=profile, inject=inject,
                             call="spawn")
        reaper.path(workdir)
        try:
            spawned.write_spec(workdir, {"ref": ref, "args": payload, "argv": list(sys.argv)})
            result = run(rc)
            outcomes = {rank: _read_outcome(workdir, result.restarts, rank) for rank in range(rc.world_size)}
        finally:
            reaper.forget(workdir)
    if result.status == JobState.SUCCEEDED:
        missing = [rank for rank, o in outcomes.items() if o is None or o[0] != "ok"]
        if missing:
            raise LaunchError(f"{name}: ranks {missing} exited 0 without a result", [])
        return [outcomes[rank][1] for rank in range(rc.world_size)]
    raise _launch_error(name, rc, result, outcomes)


def _check_arguments(args, address, env) -> None:
    """The types of spawn's own arguments (make_run_config checks the counts and durations, named as spawn's
    parameters, and the values against the config); ``env`` before it is merged into the ranks' environment."""
    sequence(args, "spawn", "args")
    if address is not None:
        text(address, "spawn", "address")
    if env is not None:
        instance(env, Mapping, "spawn", "env", "a dict of environment variables (str -> str)")


def _launch_error(name, rc, result, outcomes) -> LaunchError:
    failures, parts = [], []
    failed = list(result.failures)
    seen = {f["rank"] for f in failed}
    for rank, outcome in sorted(outcomes.items()):   # raised, but our stop signal ended it before it exited
        if outcome and outcome[0] == "error" and rank not in seen:
            failed.append({"rank": rank, "node": rc.node_of(rank), "returncode": 1, "pid": 0, "stderr_tail": []})
    for f in sorted(failed, key=lambda f: f["rank"]):
        outcome = outcomes.get(f["rank"])
        entry = {"rank": f["rank"], "node": f["node"], "returncode": f["returncode"]}
        if outcome and outcome[0] == "error":
            entry.update(outcome[1])
            head = f"{entry['type']}: {entry['message']}"
            body = entry["traceback"].rstrip("\n").splitlines()
        else:
            entry.update(type=None, message=None, traceback="\n".join(f.get("stderr_tail", [])))
            head = f"exited with {describe_exit(f['returncode'], f['pid'])}".replace("\n  error     :", ";")
            body = traceback_tail(f.get("stderr_tail", []))
        root = " (first failure)" if result.failures and f is result.failures[0] else ""
        parts.append(f"  rank {f['rank']} (node {f['node']}){root}: {head}")
        parts += ["    " + line for line in body]
        failures.append(entry)
    if result.status == JobState.FAILED:
        head = f"{name}: {len(failures)} of {rc.world_size} ranks failed"
        if result.restarts:
            head += f" (after {result.restarts} restarts)"
    elif result.status == JobState.TIMEOUT:
        head = f"{name}: timed out after {rc.timeout:g} s; ranks still running: {result.running}"
    else:
        head = f"{name}: interrupted; ranks still running: {result.running}"
    if result.diagnosis:
        parts += ["  diagnosis (flight recorder):"] + [f"    {line}" for line in result.diagnosis]
    return LaunchError("\n".join([head] + parts), failures, str(result.status), result.diagnosis)


class _ResultUnpickler(pickle.Unpickler):
    """Objects of classes defined in the caller's script come back from ranks as '__mp_main__.X'."""

    def find_class(self, module, name):
        return super().find_class("__main__" if module == "__mp_main__" else module, name)


def _read_outcome(workdir: str, attempt: int, rank: int):
    path = spawned.result_path(workdir, attempt, rank)
    if not path.exists():
        return None
    try:
        return _ResultUnpickler(io.BytesIO(path.read_bytes())).load()
    except Exception as e:
        return ("error", {"type": type(e).__name__, "message": f"cannot unpickle the result of rank {rank}: {e}",
                          "traceback": ""})
