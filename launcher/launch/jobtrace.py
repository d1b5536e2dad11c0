"""The job's flight-recorder dumps and timeline, seen from ``launch``: where the ranks write them
(``NPUSIM_TRACE_DUMP_DIR``, ``NPUSIM_PROFILE_DIR``), the analyzer's diagnosis for the failure box
(``hccl/trace.py``), and the merged ``--profile`` file (``profile.py``)."""

from __future__ import annotations

import glob
import os

from . import profile


def rank_env(rc, tmp: str) -> dict:
    """Where ranks dump their flight recorders (and profiles): the user's NPUSIM_TRACE_DUMP_DIR, else --log-dir,
    else a directory of the job's own (read for the failure box, then removed)."""
    env = {"NPUSIM_TRACE_DUMP_DIR": rc.env.get("NPUSIM_TRACE_DUMP_DIR") or rc.log_dir or os.path.join(tmp, "trace")}
    if rc.profile:
        env["NPUSIM_PROFILE_DIR"] = os.path.join(tmp, "profile")
    return env


def clear(env: dict) -> None:
    """Dumps of an earlier job or attempt must not be read as this one's."""
    for key, pattern in (("NPUSIM_TRACE_DUMP_DIR", "trace_rank*.json"), ("NPUSIM_PROFILE_DIR", "profile_rank*.json")):
        if key in env:
            for path in glob.glob(os.path.join(env[key], pattern)):
                try:
                    os.unlink(path)
                except OSError:
                    pass


def diagnose(directory: str, world: int, ended: dict | None = None) -> list[str] | None:
    """The analyzer's findings on the dumps in ``directory`` (None: no rank dumped); ``ended``: how ranks ended
    (exit code, or "stopped" by launch), for those that left no dump."""
    if not glob.glob(os.path.join(directory, "trace_rank*.json")):
        return None
    try:
        from hccl import trace
        return trace.diagnose(directory, world, ended)
    except Exception as e:  # noqa: BLE001 - the box is printed with or without a diagnosis
        return [f"(the flight-recorder analyzer failed: {type(e).__name__}: {e})"]


def write_profile(rc, directory: str, router) -> None:
    """Merge the ranks' profile dumps into ``rc.profile`` and say so (or why not) in one line."""
    try:
        n = profile.write(directory, rc.profile)
    except Exception as e:  # noqa: BLE001 - a broken profile must not hide the job's own result
        router.note(f"--profile: could not write {rc.profile}: {type(e).__name__}: {e}")
        return
    router.note(f"timeline of {n} rank(s) written to {rc.profile} (open it in https://ui.perfetto.dev or "
                f"chrome://tracing)")


def box_lines(result) -> list[str] | None:
    """The failure box's diagnosis section of a JobResult (None: nothing to say)."""
    if not result.diagnosis:
        return None
    where = f"python -m hccl.trace {result.trace_dir}" if result.trace_dir else "kept with --log-dir DIR"
    return [f"Diagnosis (flight recorder; {where}):", *[f"  {line}" for line in result.diagnosis]]
