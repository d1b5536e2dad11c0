"""What a child of the fork server does to become ``python -u <program>`` (see the package docstring): it runs in
the rank's process, from the fork until the rank's exit."""

from __future__ import annotations

import atexit
import gc
import io
import os
import runpy
import signal
import sys
import threading
import traceback
import types

from ..deathsig import die_with_parent

# The server's frames and ours: a rank's traceback shows none of them, as a fresh interpreter's would not.
_HERE = {os.path.abspath(__file__), os.path.abspath(os.path.join(os.path.dirname(__file__), "server.py"))}


def become_rank(req: dict, stdout_fd: int, stderr_fd: int, server_sock) -> None:
    """Turn this freshly forked child into the rank ``req`` describes, run it, and exit with its status."""
    gc.enable()                     # the server runs without collections; what it made is frozen (server.py)
    try:
        code = _setup_and_run(req, stdout_fd, stderr_fd, server_sock)
    except BaseException:  # noqa: BLE001 - nothing may return into the server's loop
        try:
            traceback.print_exc()
        finally:
            os._exit(1)
    os._exit(code)


def _setup_and_run(req, stdout_fd, stderr_fd, server_sock) -> int:
    os.setsid()
    die_with_parent(os.getppid())                                # the server's
    server_sock.close()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    for fd in (devnull, stdout_fd, stderr_fd):
        if fd > 2:
            os.close(fd)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(req["cwd"])
    old_pythonpath = os.environ.get("PYTHONPATH", "")
    os.environ.clear()
    os.environ.update(req["env"])
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)       # python -u
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace")
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    _fresh_randomness()
    program = list(req["program"])
    first = _sys_path(program, old_pythonpath)
    return _run(program, first)


def _fresh_randomness() -> None:
    """``random`` reseeds itself after fork; numpy's legacy global generator does not: reseed it as a fresh
    interpreter would be seeded (from the OS)."""
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


def _sys_path(program: list, old_pythonpath: str) -> str:
    """``sys.path`` as ``python -u <program>`` with this environment would have it; returns its first entry."""
    if program[0] == "-c":
        first = ""
    elif program[0] == "-m":
        first = os.getcwd()
    else:
        first = os.path.dirname(os.path.abspath(program[0]))
    old = [p for p in old_pythonpath.split(os.pathsep) if p]
    new = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if p not in old]
    sys.path[:] = [first] + [os.path.abspath(p) for p in new] + base
    return first


def _run(program: list, first: str) -> int:
    try:
        if program[0] == "-c":
            sys.argv = ["-c", *program[2:]]
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = main
            exec(compile(program[1], "<string>", "exec"), main.__dict__)
        elif program[0] == "-m":
            sys.argv = [program[1], *program[2:]]
            runpy.run_module(program[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(program)
            runpy.run_path(program[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt as e:
        _print_exception(e)
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)       # as the interpreter ends after an uncaught KeyboardInterrupt
        code = 130
    except BaseException as e:  # noqa: BLE001 - printed as the interpreter prints an uncaught exception
        _print_exception(e)
        code = 1
    _finish()
    return code


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    try:
        print(value, file=sys.stderr)
    except Exception:  # noqa: BLE001
        pass
    return 1


def _print_exception(e: BaseException) -> None:
    """sys.excepthook, without the frames of this module and of runpy (a fresh interpreter has neither)."""
    tb = e.__traceback__
    skip = _HERE | {os.path.abspath(runpy.__file__)}
    while tb is not None and (tb.tb_frame.f_code.co_filename in skip or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")):
        tb = tb.tb_next
    sys.excepthook(type(e), e, tb)


def _finish() -> None:
    """What interpreter shutdown does first: wait for non-daemon threads, run atexit handlers, flush."""
    try:
        threading._shutdown()
    except Exception:  # noqa: BLE001
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
