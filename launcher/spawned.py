"""Inside each rank of ``launcher.spawn``: re-import ``fn`` by reference, run it on the pickled args, write the outcome.

A spawned rank is ``python -u -c BOOT WORKDIR`` (forked from the fork server, which imports this module
beforehand). ``WORKDIR`` is the job's private temp dir (``spawn.py``): ``spec.pkl`` holds fn's reference, the
pickled args and the caller's ``sys.argv``; each rank writes ``result.<attempt>.<rank>.pkl`` — ``("ok", value)`` or
``("error", {type, message, traceback})`` — before it exits.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import sys
import traceback
from pathlib import Path

BOOT = "from launcher.spawned import main; main()"


def write_spec(workdir: str, spec: dict) -> None:
    """What every rank reads first (written by the caller before the ranks start)."""
    (Path(workdir) / "spec.pkl").write_bytes(pickle.dumps(spec))


def result_path(workdir: str, attempt: int, rank: int) -> Path:
    return Path(workdir) / f"result.{attempt}.{rank}.pkl"


def _load_function(ref: dict):
    """Re-import fn's module as the caller had it, then look fn up by qualified name."""
    name, file = ref["module"], Path(ref["file"])
    if name == "__main__":
        sys.path.insert(0, str(file.parent))  # as when the script itself runs
        spec = importlib.util.spec_from_file_location("__mp_main__", file)
        module = importlib.util.module_from_spec(spec)
        sys.modules["__mp_main__"] = sys.modules["__main__"] = module  # pickles naming __main__ resolve here
        spec.loader.exec_module(module)
    else:
        # The directory the caller imported it from (pytest's rootdir-relative name or a package path).
        depth = name.count(".") + (1 if file.name == "__init__.py" else 0)
        sys.path.insert(0, str(file.parents[depth]))
        module = importlib.import_module(name)
        if Path(module.__file__).resolve() != file:
            raise ImportError(f"spawn: module {name!r} resolved to {module.__file__} in the rank, "
                              f"but the caller's fn came from {file}")
    obj = module
    for part in ref["qualname"].split("."):
        obj = getattr(obj, part)
    return obj


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main() -> None:
    """Entry point of a spawned rank: ``python -u -c <BOOT> <workdir>``."""
    workdir = Path(sys.argv[1])
    out = result_path(str(workdir), int(os.environ["RESTART_COUNT"]), int(os.environ["RANK"]))
    spec = pickle.loads((workdir / "spec.pkl").read_bytes())
    sys.argv = spec["argv"]          # as multiprocessing: a module parsing sys.argv at import sees the caller's
    try:
        fn = _load_function(spec["ref"])
        value = fn(*pickle.loads(spec["args"]))
        data = pickle.dumps(("ok", value))
    except BaseException as e:  # SystemExit / KeyboardInterrupt in fn are failures of that rank too
        text = traceback.format_exc()
        sys.stderr.write(text)
        kind = type(e)
        error = {"type": kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}",
                 "message": str(e), "traceback": text}
        _write_atomic(out, pickle.dumps(("error", error)))
        recorder = sys.modules.get("rt.diag.recorder")
        if recorder is not None:                    # the rank used cards: its flight recorder tells what it did
            recorder.RECORDER.uncaught(text, f"uncaught {kind.__name__}: {e}")
        sys.exit(1)
    _write_atomic(out, data)
