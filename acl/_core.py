"""The conventions of pyACL, in one place: return codes instead of exceptions, integer handles.

pyACL never raises for a failed call: a function returns ``ret`` (0 = ``ACL_SUCCESS``), or a tuple with
``ret`` last, and programs test it. Every facade function is written against ``rt`` (which raises) and
wrapped here:

- :func:`code` — the call returns ``ret``;
- :func:`values` — the call returns its values and ``ret`` last (``(ptr, ret)``, ``(free, total, ret)``);
  on failure the given defaults stand in for the values;
- :func:`plain` — a getter that cannot fail in pyACL returns the bare value (a default on failure).

A failure's message is kept for ``acl.get_recent_err_msg()`` and logged once (logger ``npusim.acl``, to
stderr unless the program configures logging): the program keeps running, as on CANN. Anything that is not
an ``NpuError`` is an npusim bug; it still becomes a code (``ACL_ERROR_INTERNAL_ERROR``), never an escape.

Handles (contexts, streams, events, descs, datasets, data buffers) are plain ints, as pyACL's are: programs
store, compare and truth-test them; ``0`` is the null handle (the default stream).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import os
import threading
import traceback

from rt import args, errors
from rt.constants import AclErrorCode as E
from rt.diag import slog
from rt.errors import AclError, NpuError
from rt.host.runtime import RUNTIME

log = logging.getLogger("npusim.acl")
_logged: set[str] = set()
_log_lock = threading.Lock()


def strict() -> bool:
    """``NPUSIM_ACL_STRICT=1``: CANN's leniency (the advisory memcpy kind)
    become errors."""
    return os.environ.get("NPUSIM_ACL_STRICT", "0").lower() in ("1", "true", "yes", "on")


def report(call: str, exc: BaseException) -> int:
    """Record ``exc`` for get_recent_err_msg, log it once, return its ACL code."""
    if isinstance(exc, NpuError):
        code, message = exc.code, exc.message
    else:
        code = int(E.ACL_ERROR_INTERNAL_ERROR)
        message = f"{call}: internal error in npusim: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    errors.record_error_message(message, dedupe=True, module=exc if isinstance(exc, NpuError) else slog.ASCENDCL)
    slog.error(slog.ASCENDCL, "acl.%s failed, ret = %d", call, code, user_site=True)
    with _log_lock:
        first = message not in _logged
        if first and len(_logged) < 10_000:
            _logged.add(message)
    if first:
        log.error("acl.%s failed with %d: %s", call, code, message)
    return code


# What a program may release in __del__ at interpreter shutdown, after npusim's atexit finalize released it already
RELEASES = frozenset({"finalize", "rt.reset_device", "rt.reset_device_force", "rt.destroy_context", "rt.destroy_stream",
                      "rt.destroy_stream_force", "rt.destroy_event", "rt.free", "rt.free_host", "rt.unsubscribe_report",
                      "mdl.unload", "media.dvpp_free"})
PASSTHROUGH = frozenset({"user_data", "args_list"})     # the program's own objects, handed to its callback
INT_LO, INT_HI = -(1 << 63), 1 << 64                     # what a C int64_t / uint64_t parameter can hold


def _c_ints(fn):
    """A checker that refuses, for ``fn``'s parameters, an int (or an int in a list/tuple) no 64-bit C
    parameter holds: pyACL's binding cannot parse it, and npusim's messages could not even print it."""
    names = list(inspect.signature(fn).parameters)

    def check(call, given, kwargs):
        for name, value in itertools.chain(zip(names, given), kwargs.items()):
            if name in PASSTHROUGH:
                continue
            items = value if isinstance(value, (list, tuple)) else (value,)
            for v in items:
                if type(v) is int and not INT_LO <= v < INT_HI:
                    raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {name} {args.shown(v)} does not fit a 64-bit C "
                                                              f"integer")
    return check


def _facade(call: str, fn, done, failed, form: str, default=None):
    """``fn`` behind pyACL's convention: its C-int arguments checked, ``done(result)`` on success,
    ``failed(ret)`` with the code of anything it raised. ``form``/``default`` say which convention (tests read them)."""
    check = _c_ints(fn)

    @functools.wraps(fn)
    def facade(*args, **kwargs):
        try:
            check(call, args, kwargs)
            out = fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - pyACL returns codes, never raises
            if call in RELEASES and RUNTIME.exited and not RUNTIME.initialized:
                return done(None)       # released at exit already (finalize_at_exit): a __del__ at shutdown
            return failed(report(call, e))
        return done(out)
    facade.acl_form, facade.acl_default = form, default
    return facade


def code(call: str):
    """Decorate a function whose pyACL form returns ``ret``."""
    return lambda fn: _facade(call, fn, lambda out: 0, lambda ret: ret, "code")


def values(call: str, *defaults):
    """Decorate a function whose pyACL form returns ``(*values, ret)``; ``defaults`` stand in on failure."""
    done = (lambda out: (*out, 0)) if len(defaults) > 1 else (lambda out: (out, 0))
    return lambda fn: _facade(call, fn, done, lambda ret: (*defaults, ret), "values", defaults)


def plain(call: str, default):
    """Decorate a getter whose pyACL form returns a bare value (``default`` when it fails)."""
    return lambda fn: _facade(call, fn, lambda out: out, lambda ret: default, "plain", default)


def _a(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind


class Handles:
    """Integer handles for the facade's objects (pyACL's handles are ints): never 0, never reused."""

    def __init__(self):
        self._next = itertools.count(0x1000_0000, 0x10)
        self._objects: dict[int, tuple[str, object]] = {}
        self._ids: dict[int, int] = {}                 # id(object) -> handle, for objects made by rt itself
        self._lock = threading.Lock()

    def add(self, kind: str, obj) -> int:
        with self._lock:
            h = self._ids.get(id(obj))
            if h is not None and self._objects.get(h, (None, None))[1] is obj:
                return h
            h = next(self._next)
            self._objects[h] = (kind, obj)
            self._ids[id(obj)] = h
            return h

    def get(self, h, kind: str, call: str, what: str):
        """The object of handle ``h`` of ``kind``, or 100000 naming what was expected."""
        with self._lock:
            entry = self._objects.get(h) if isinstance(h, int) and not isinstance(h, bool) else None
        if entry is None or entry[0] != kind:
            shown = f"{h:#x}" if isinstance(h, int) and not isinstance(h, bool) else repr(h)
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"{call}: {shown} is not {what}"
                                                      + (" (unknown, or destroyed already)" if entry is None else
                                                         f" (it is the handle of {_a(entry[0])})"))
        return entry[1]

    def drop(self, h) -> None:
        with self._lock:
            entry = self._objects.pop(h, None)
            if entry is not None:
                self._ids.pop(id(entry[1]), None)


HANDLES = Handles()


CONTEXT, STREAM, EVENT = "context", "stream", "event"


def context_of(h, call: str):
    return HANDLES.get(h, CONTEXT, call, "a context (acl.rt.create_context)")


def stream_of(h, call: str):
    """The rt Stream of handle ``h``; 0 (or None) is the current context's default stream."""
    if h is None or (args.is_int(h) and h == 0):
        return None
    return HANDLES.get(h, STREAM, call, "a stream (acl.rt.create_stream)")


def event_of(h, call: str):
    return HANDLES.get(h, EVENT, call, "an event (acl.rt.create_event)")
