"""The flight recorder's dumps (``rt/diag/recorder.py``): a rank's ring joined with its cards' task logs, written
as JSON, and the automatic dumps — on a job-wide failure a card reports, an uncaught exception, SIGTERM and
SIGUSR1 — plus the profile written at exit under ``launch --profile``.

The functions take the recorder they work for; the recorder calls :func:`install` when it first uses a card.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback

from ..host import runtime
from ..wire import client as wire_client

CARD_QUERY_TIMEOUT = 2.0        # seconds a dump waits for a card's task log
FORMAT = 1
# A collective's ring entry is a list (built on every call, it must be cheap; every other entry is a dict): its
# slots, in order. "placed" is False while the host is in the call, True once the call went to a stream task,
# HOST_DONE once it completed in this process (the host path).
CALL_SLOTS = ("id", "kind", "op", "client", "stream", "task", "site", "t_enq", "group", "p", "b", "calls", "seq",
              "placed", "t_end")
HOST_DONE = "completed"


def card_logs(rec) -> dict:
    """``{card name: [card clock then, {sid: task log}]}`` of every card ``rec`` used: asked now, or, for a card
    that is gone or does not answer within CARD_QUERY_TIMEOUT, as an earlier dump or the context's release last
    saw it (a SIGTERM after the process released its cards must not lose what they said)."""
    for client in list(rec.clients.values()):
        if not getattr(client, "lost", True):
            fetch_log(rec, client)
    return dict(rec.saved_logs)


def fetch_log(rec, client) -> None:
    """Ask ``client``'s card for its task log and keep it; streams released since the last answer (the context
    went) keep what they last said. A card that is gone or busy is skipped."""
    try:
        now, per_stream = client.call("trace_tasks", timeout=CARD_QUERY_TIMEOUT)
    except Exception:  # noqa: BLE001 - a dump never fails because a card is gone or busy
        return
    old = rec.saved_logs.get(client.name)
    rec.saved_logs[client.name] = [now, {**(old[1] if old else {}), **per_stream}]


def snapshot(rec, reason: str) -> dict:
    entries = [_expand(e) for e in list(rec.entries)]
    logs = card_logs(rec)
    progress = {}
    for client in list(rec.clients.values()):
        for sid in list(getattr(client, "_submitted", {})):
            progress[f"{client.name}/{sid}"] = [client.submitted(sid), client.stream_progress(sid)]
    tasks = {}
    for card, (_, per_stream) in logs.items():
        for sid, log in per_stream.items():
            for t in log:
                if t[1]:
                    tasks[(card, int(sid), t[1])] = t
    for e in entries:
        if e.get("placed") is False:
            e["state"] = "in the call"      # the host was still inside it (waiting for peers)
            continue
        if e["task"] is None or e.get("state"):
            continue
        t = tasks.get((e["card"], e["stream"], e["task"]))
        if t is not None:
            e["t_start"] = t[2]
            if t[3]:
                e["t_end"] = t[3]
                e["state"] = "completed" if t[4] else "failed"
            else:
                e["state"] = "started"
            note = t[5] or {}
            if "algo" in note:
                e["algo_used"] = note["algo"]
            continue
        _, done = progress.get(f"{e['card']}/{e['stream']}", [None, None])
        if done is not None and done >= e["task"]:
            e["state"] = "finished"          # the card got past it; whether it failed, its log no longer says
        else:
            e["state"] = "enqueued" if e["card"] in logs else "not completed"
    return {"format": FORMAT, "rank": rec.rank_label(), "pid": os.getpid(), "host": socket.gethostname(),
            "argv": sys.argv, "reasons": rec.reasons + [reason], "exception": rec.exception,
            "main_stack": rec.main_stack(),
            "now_ns": time.monotonic_ns(), "wall_offset_ns": time.time_ns() - time.monotonic_ns(),
            "buffer_size": rec.size, "dropped": max(0, rec.last_id - len(entries)),
            "entries": entries, "cards": logs, "streams": progress}


def site_text(site) -> str:
    """"/path/common.py:17 < /path/train.py:40" of a :meth:`Recorder.site` tuple."""
    if site is None:
        return "?"
    code, offset, up, up_offset = site
    here = f"{code.co_filename}:{line_of(code, offset)}"
    return f"{here} < {up.co_filename}:{line_of(up, up_offset)}" if up is not None and up.co_filename[0] != "<" \
        else here


def line_of(code, offset: int):
    """The source line of the instruction at byte ``offset`` of ``code`` (what a frame's ``f_lineno`` says when
    its ``f_lasti`` is ``offset``)."""
    line = code.co_firstlineno
    for start, end, number in code.co_lines():
        if start <= offset < end:
            return number if number is not None else line
        if number is not None:
            line = number
    return line


def _expand(e) -> dict:
    """A ring entry as the dump shows it (plain JSON values); a collective's fields are its package's."""
    if isinstance(e, list):
        return _expand_call(e)
    out = dict(e)
    out["card"] = getattr(out.pop("client"), "name", "?")
    out["site"] = site_text(e.get("site"))
    calls = out.pop("calls", None)
    group, params, buffers = out.pop("group", None), out.pop("p", None), out.pop("b", None)
    if calls is not None:
        out.update(calls.fields(e["kind"], group, params, buffers))
    return out


def _expand_call(e: list) -> dict:
    """A collective's entry (``CALL_SLOTS``) as the dump shows it."""
    n, kind, op, client, stream, task, site, t_enq, group, params, buffers, calls, seq, placed, t_end = e
    out = {"id": n, "kind": kind, "op": op, "card": getattr(client, "name", "?"), "stream": stream, "task": task,
           "site": site_text(site), "t_enq": t_enq, "placed": placed is not False}
    if seq is not None:
        out["seq"] = seq
    if placed == HOST_DONE:
        out.update(state="completed", t_end=t_end, algo_used="staged (host path)")
    out.update(calls.fields(kind, group, params, buffers))
    return out


def write(path: str, data: dict) -> str | None:
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, default=str)
        os.replace(tmp, path)
        return path
    except OSError as e:
        print(f"npusim: cannot write the flight recorder dump {path}: {e}", file=sys.stderr)
        return None


# -- automatic dumps --------------------------------------------------------------------------------------
def install(rec) -> None:
    """Dump on job-wide card failures, uncaught exceptions, SIGTERM and SIGUSR1 (handlers only where none is
    set); keep a card's task log before its context goes; write the profile at exit."""
    wire_client.ERROR_HOOKS.append(lambda err: _on_card_error(rec, err))
    runtime.RELEASE_HOOKS.append(rec.save_logs)
    if rec.profile_dir:
        atexit.register(rec.write_profile)
    previous = sys.excepthook

    def excepthook(tp, value, tb):
        if tp is not KeyboardInterrupt or rec.directory():
            rec.uncaught("".join(traceback.format_exception(tp, value, tb)), f"uncaught {tp.__name__}: {value}")
        previous(tp, value, tb)
    sys.excepthook = excepthook
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        try:
            if signal.getsignal(signum) in (signal.SIG_DFL, None):
                signal.signal(signum, lambda n, frame: _on_signal(rec, n))
        except (ValueError, OSError):
            pass


def _on_card_error(rec, err) -> None:
    if getattr(err, "job_wide", False) and rec.directory():
        dump_quietly(rec, f"{type(err).__name__} [{err.code}]: {err.message[:300]}")


def dump_quietly(rec, reason: str) -> None:
    """A dump from a signal handler or hook: in a thread (the interrupted code may hold a client lock), waited
    for a bounded time, never raising."""
    if not rec.directory():
        return
    done = threading.Event()

    def run():
        try:
            rec.dump(reason)
        except Exception as e:  # noqa: BLE001 - diagnosing must never break the program
            print(f"npusim: flight recorder dump failed: {type(e).__name__}: {e}", file=sys.stderr)
        finally:
            done.set()
    threading.Thread(target=run, name="npusim-trace-dump", daemon=True).start()
    done.wait(CARD_QUERY_TIMEOUT * 2 + 1)


def _on_signal(rec, signum) -> None:
    name = signal.Signals(signum).name
    dump_quietly(rec, f"{name} received")
    if signum == signal.SIGTERM:
        if rec.profile_dir:
            rec.write_profile()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
