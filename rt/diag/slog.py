"""The host log of CANN (slog / plog), for npusim's own lines: levels, files and line format as CANN's.

- ``ASCEND_GLOBAL_LOG_LEVEL``: 0 debug, 1 info, 2 warning, 3 error (the default), 4 null (nothing);
  ``ASCEND_MODULE_LOG_LEVEL=HCCL=1:RUNTIME=0`` overrides it per module (as CANN: a malformed value, or one
  naming a module CANN does not have, is ignored as a whole).
- ``ASCEND_PROCESS_LOG_PATH`` is the log root (default ``~/ascend/log``); each process writes one file
  ``<root>/debug/plog/plog-<pid>_<YYYYMMDDhhmmssmmm>.log``, created at the first line actually logged (a
  process that logs nothing creates no file and no directory). A file is closed at 20 MiB and a new one
  started; ``ASCEND_HOST_LOG_FILE_NUM`` (1..1000, default 10) of a process's files are kept.
- ``ASCEND_SLOG_PRINT_TO_STDOUT=1``: lines go to stdout instead of the file.

A line is CANN's::

    [ERROR] HCCL(36035,python3):2025-05-13-02:25:58.068.817 [train.py:52][36818]comm init 'x': EI0006 ...

``[LEVEL] MODULE(pid,process name):YYYY-MM-DD-hh:mm:ss.mmm.uuu [file:line][tid]message``: the file and line
are npusim's source location, or for errors the program's own call site; ``tid`` is the OS thread id. A
message of several lines is written as several lines, each with the header.

The environment is read at the first line a process considers (again after a fork, so a rank forked from
a pre-imported server reads its own). Filtering comes before any formatting: ``debug(RUNTIME, "x %d", n)``
costs a dict lookup when debug is off; callers building an expensive message test :func:`enabled` first.
Nothing here raises into the caller: a log directory that cannot be created costs one warning on stderr,
and the process's lines are dropped from then on.
"""

from __future__ import annotations

import atexit
import datetime
import os
import sys
import sysconfig
import threading

from . import callsite

DEBUG, INFO, WARNING, ERROR, NULL = 0, 1, 2, 3, 4
LEVEL_NAMES = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_LEVEL = ERROR

# CANN's module tags of npusim's lines: the runtime, collectives, the pyACL facade, offline models. An error's
# lines carry its class's ``log_module`` (``rt/errors.py``).
RUNTIME, HCCL, ASCENDCL, GE = "RUNTIME", "HCCL", "ASCENDCL", "GE"
# Module names CANN's log_types.h knows: ASCEND_MODULE_LOG_LEVEL may name any of them.
CANN_MODULES = frozenset(
    "SLOG IDEDD IDEDH HCCL FMK HIAIENGINE DVPP RUNTIME CCE HDC DRV MDCFUSION MDCLOCATION MDCPERCEPTION MDCFSM "
    "MDCCOMMON MDCMONITOR MDCBSWP MDCDEFAULT MDCSC MDCPNC MLL DEVMM KERNEL LIBMEDIA CCECPU ASCENDDK ROS HCCP "
    "ROCE TEFUSION PROFILING DP APP TS TSDUMP AICPU LP TDT FE MD MB ME IMU IMP GE MDCFUSA CAMERA ASCENDCL "
    "TEEOS ISP SIS HSM DSS PROCMGR BBOX AIVECTOR TBE FV MDCMAP TUNE HSS FFTS OP UDF HICAID TSYNC AUDIO TPRT "
    "ASCENDCKERNEL ASYS ATRACE RTC SYSMONITOR AML ADETECT".split())

FILE_BYTES = 20 << 20          # CANN: a plog file is closed at 20 MB and a new one begun
DEFAULT_FILE_NUM = 10          # ASCEND_HOST_LOG_FILE_NUM's default: files kept per process


# ---------------------------------------------------------------- configuration (read lazily, per process)
class _Config:
    __slots__ = ("default", "file_num", "levels", "root", "stdout")

    def __init__(self, env):
        self.default = _level(env.get("ASCEND_GLOBAL_LOG_LEVEL"), DEFAULT_LEVEL)
        self.levels = _module_levels(env.get("ASCEND_MODULE_LOG_LEVEL"))
        self.stdout = env.get("ASCEND_SLOG_PRINT_TO_STDOUT", "").strip() == "1"
        root = env.get("ASCEND_PROCESS_LOG_PATH", "").strip()
        self.root = os.path.abspath(os.path.expanduser(root or os.path.join("~", "ascend", "log")))
        num = env.get("ASCEND_HOST_LOG_FILE_NUM", "").strip()
        self.file_num = int(num) if num.isdigit() and 1 <= int(num) <= 1000 else DEFAULT_FILE_NUM


def _level(text, default: int) -> int:
    """A level 0..4 as CANN parses it; anything else (unset, empty, "7", "info") means ``default``."""
    text = (text or "").strip()
    return int(text) if text in ("0", "1", "2", "3", "4") else default


def _module_levels(text) -> dict[str, int]:
    """``HCCL=1:RUNTIME=3`` → {"HCCL": 1, "RUNTIME": 3}; CANN ignores a malformed value as a whole."""
    out: dict[str, int] = {}
    for part in (text or "").split(":") if text else ():
        name, eq, value = part.partition("=")
        if not eq or name not in CANN_MODULES or value not in ("0", "1", "2", "3", "4"):
            return {}
        out[name] = int(value)
    return out


_cfg: _Config | None = None


def _config() -> _Config:
    global _cfg
    cfg = _cfg
    if cfg is None:
        try:
            cfg = _Config(os.environ)
        except Exception:  # noqa: BLE001 - never raise into a caller; fall back to CANN's defaults
            cfg = _Config({})
        _cfg = cfg
    return cfg


def enabled(module: str, level: int) -> bool:
    """Whether a line of ``level`` from ``module`` would be written (the cheap test for hot paths)."""
    cfg = _cfg or _config()
    return level >= cfg.levels.get(module, cfg.default) and level < NULL


def module_of(error) -> str:
    """The module tag of an npusim error: its class's ``log_module`` (RUNTIME for the runtime's own)."""
    return getattr(error, "log_module", RUNTIME)


# ---------------------------------------------------------------- the API
def debug(module: str, msg: str, *args, **kw) -> None:
    cfg = _cfg or _config()
    if DEBUG >= cfg.levels.get(module, cfg.default):
        _emit(DEBUG, module, msg, args, **kw)


def info(module: str, msg: str, *args, **kw) -> None:
    cfg = _cfg or _config()
    if INFO >= cfg.levels.get(module, cfg.default):
        _emit(INFO, module, msg, args, **kw)


def warning(module: str, msg: str, *args, **kw) -> None:
    cfg = _cfg or _config()
    if WARNING >= cfg.levels.get(module, cfg.default):
        _emit(WARNING, module, msg, args, **kw)


def error(module: str, msg: str, *args, **kw) -> None:
    cfg = _cfg or _config()
    if ERROR >= cfg.levels.get(module, cfg.default):
        _emit(ERROR, module, msg, args, **kw)


def log(level: int, module: str, msg: str, *args, **kw) -> None:
    """A line of ``level`` (0..3); ``msg % args`` is formatted only if it is written."""
    cfg = _cfg or _config()
    if DEBUG <= level < NULL and level >= cfg.levels.get(module, cfg.default):
        _emit(level, module, msg, args, **kw)


def record_error(text: str, module=None) -> None:
    """The plog line of an error npusim records (``errors.record_error_message``): ERROR, at the program's
    call site. ``module`` is a tag, or the error whose type gives it (:func:`module_of`); None: RUNTIME."""
    cfg = _cfg or _config()
    if module is None:
        module = RUNTIME
    elif not isinstance(module, str):
        module = module_of(module)
    if ERROR >= cfg.levels.get(module, cfg.default):
        _emit(ERROR, module, text, (), stacklevel=2, user_site=True)


def current_file() -> str | None:
    """The plog file this process writes now, or None (nothing logged yet, stdout, or logging broken)."""
    return _state.path if _state.pid == os.getpid() else None


# ---------------------------------------------------------------- call sites
def _package_dirs() -> tuple[str, ...]:
    """Where npusim's own code lives (its packages and tools), and the interpreter's: not a program's call site."""
    dirs = [*callsite.PACKAGE_DIRS, *callsite.TOOL_DIRS]
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.append(os.path.join(path, ""))
    return tuple(dirs)


_SKIP = _package_dirs()


def _site(depth: int, user: bool) -> str:
    """``file:line`` of the frame ``depth`` levels above the logging call; with ``user``, the innermost
    frame outside npusim and the interpreter's libraries if there is one (the program's call site)."""
    try:
        f = sys._getframe(depth)
    except ValueError:
        return "?:0"
    if user:
        g = callsite.outside(f, _SKIP + ("<frozen",))
        f = g if g is not None else f
    return callsite.text(f.f_code, f.f_lineno)


# ---------------------------------------------------------------- writing
class _State:
    def __init__(self):
        self.pid = -1                 # the process the fields below belong to
        self.fd = -1                  # the open plog file (-1: none yet)
        self.path: str | None = None
        self.size = 0                 # bytes in it
        self.files: list[str] = []    # this process's plog files, oldest first (ASCEND_HOST_LOG_FILE_NUM)
        self.broken = False           # the directory or file could not be made: drop lines (warned once)
        self.last: datetime.datetime | None = None   # the time in the newest file's name
        self.pname = ""               # the process name of the lines


_state = _State()
_lock = threading.RLock()       # re-entrant: a signal handler may log while its thread holds it


def _process_name() -> str:
    try:
        with open("/proc/self/comm", encoding="utf-8", errors="replace") as f:
            name = f.read().strip()
    except OSError:
        name = ""
    return name or os.path.basename(sys.executable or "python") or "python"


def _stamp(now: datetime.datetime) -> str:
    us = now.microsecond
    return f"{now:%Y-%m-%d-%H:%M:%S}.{us // 1000:03d}.{us % 1000:03d}"


def _emit(level: int, module: str, msg: str, args, stacklevel: int = 1, user_site: bool = False) -> None:
    """Format and write one record (the level already passed). Never raises."""
    try:
        text = (msg % args if args else str(msg)).rstrip("\n")
        site = _site(stacklevel + 2, user_site)
        now = datetime.datetime.now()
        pid = os.getpid()
        if _state.pid != pid:
            _adopt(pid)
        head = f"[{LEVEL_NAMES[level]}] {module}({pid},{_state.pname}):{_stamp(now)} " \
               f"[{site}][{threading.get_native_id()}]"
        lines = "".join(f"{head}{line}\n" for line in text.split("\n"))
        cfg = _cfg or _config()
        if cfg.stdout:
            out = sys.stdout
            if out is not None:
                with _lock:
                    out.write(lines)
                    out.flush()
            return
        data = lines.encode("utf-8", "backslashreplace")
        with _lock:
            if _state.broken:
                return
            if _state.fd < 0 or _state.size + len(data) > FILE_BYTES and _state.size:
                _open_locked(cfg, now)
                if _state.fd < 0:
                    return
            os.write(_state.fd, data)
            _state.size += len(data)
    except Exception:  # noqa: BLE001 - logging must never fail the caller
        pass


def _adopt(pid: int) -> None:
    """First line of this process (or first after a fork): forget the parent's file, name this process."""
    with _lock:
        if _state.pid == pid:
            return
        _state.fd = -1               # the parent's descriptor is closed by _after_fork
        _state.path, _state.size, _state.files, _state.broken, _state.last = None, 0, [], False, None
        _state.pname = _process_name()
        _state.pid = pid


def _open_locked(cfg: _Config, now: datetime.datetime) -> None:
    """Start this process's next plog file (called with the lock held); on failure warn once, stop."""
    _close_locked()
    directory = os.path.join(cfg.root, "debug", "plog")
    when = now.replace(microsecond=now.microsecond // 1000 * 1000)
    if _state.last is not None and when <= _state.last:     # a rotation within the same millisecond
        when = _state.last + datetime.timedelta(milliseconds=1)
    _state.last = when
    path = os.path.join(directory, f"plog-{_state.pid}_{when:%Y%m%d%H%M%S}{when.microsecond // 1000:03d}.log")
    try:
        os.makedirs(directory, mode=0o750, exist_ok=True)
        _state.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
    except OSError as e:
        _state.broken = True
        try:
            print(f"npusim: cannot write the log file {path} ({e.strerror or e}); ASCEND_PROCESS_LOG_PATH "
                  f"names the log root, ASCEND_SLOG_PRINT_TO_STDOUT=1 prints lines instead. Log lines of "
                  f"this process are dropped.", file=sys.stderr)
        except Exception:  # noqa: BLE001
            pass
        return
    _state.path, _state.size = path, 0
    _state.files.append(path)
    while len(_state.files) > cfg.file_num:
        old = _state.files.pop(0)
        try:
            os.unlink(old)
        except OSError:
            pass


def _close_locked() -> None:
    if _state.fd >= 0 and _state.pid == os.getpid():
        try:
            os.close(_state.fd)
        except OSError:
            pass
    _state.fd, _state.path = -1, None


def _close_at_exit() -> None:
    with _lock:
        _close_locked()


def _after_fork() -> None:
    """In a forked child: a fresh lock, the parent's descriptor closed, the environment read again."""
    global _lock, _cfg
    _lock = threading.RLock()
    if _state.fd >= 0:
        try:
            os.close(_state.fd)
        except OSError:
            pass
    _state.fd, _state.path, _state.pid = -1, None, -1
    _cfg = None


atexit.register(_close_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
