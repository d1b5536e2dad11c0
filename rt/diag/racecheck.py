"""The stream race detector (``NPUSIM_RACE_CHECK=1``, ``launch --race-check``): unordered accesses, found on every run.

A happens-before model in the style of PyTorch's CUDA stream sanitizer, over every stream of every card this
process drives (and the host threads that drive them):

- each stream and each host thread has a vector clock; a task enqueued on a stream ticks that stream's clock
  and inherits the enqueuing thread's (program order: what the host did before enqueueing happens before the
  task), an event record snapshots its stream's clock, ``stream_wait_event`` joins it into the waiting
  stream, ``synchronize_stream``/``synchronize_device``/``synchronize_event`` (and a query that reports
  completion) join the stream's or event's clock into the host thread's;
- a collective is a synchronisation among its ranks: the streams of every rank of it in this process end up
  knowing each other's clocks (``comm_init_all`` drives several cards from one process);
- every task declares the byte ranges it reads and writes: copies (source and destination, device, pinned
  or pageable host memory), memsets, kernels (inputs read, outputs written; a user ``@rt.kernel`` may also
  read its outputs), collectives (send read, recv written), send/recv, model executions (input dataset read,
  output dataset written); synchronous copies and memsets are accesses of the host thread.

Two accesses to overlapping bytes, at least one a write, that neither happens before the other are a race;
so is ``rt.free`` of memory a queued task may still read or write. Each race is reported once per pair of call
sites, naming both accesses (task, stream, card, call site), the bytes and the allocation they are in:

- ``NPUSIM_RACE_CHECK=1`` (or ``report``): a ``rt.RaceWarning`` (a warning, on stderr by default);
- ``NPUSIM_RACE_CHECK=raise``: the next synchronize call of the process raises ``rt.RaceError`` (an
  ``AclError`` with ACL_ERROR_FAILURE, 500001: CANN has no code for a race) carrying every race found.

What it cannot see: host code reading or writing a numpy array or a pinned ``HostBuffer`` directly (only
accesses through rt calls are known); memory another process writes outside collectives; kernels that write
their inputs in place. Off by default; configured from the environment at the first traced call. It observes
the host through the seam (``rt/host/seam.py``).
"""

from __future__ import annotations

import bisect
import os
import sys
import threading
import warnings

from ..constants import AclErrorCode as E
from ..errors import AclError
from ..host.seam import SEAM, Observer
from . import callsite

MAX_ACCESSES = 64          # remembered accesses per region; the oldest ordered ones go first


class RaceWarning(UserWarning):
    """A race the detector found (``NPUSIM_RACE_CHECK=1``)."""


class RaceError(AclError):
    """Races the detector found (``NPUSIM_RACE_CHECK=raise``), raised at the next synchronize."""

    def __init__(self, message: str, races: list[str] | None = None):
        super().__init__(E.ACL_ERROR_FAILURE, message)
        self.races = races or [message]


class _Access:
    __slots__ = ("start", "end", "write", "clock_key", "epoch", "what", "where", "site")

    def __init__(self, start, end, write, clock_key, epoch, what, where, site):
        self.start, self.end, self.write = start, end, write
        self.clock_key, self.epoch = clock_key, epoch
        self.what, self.where, self.site = what, where, site


class _Group:
    """One collective (comm, seq): the joined clock of its participants in this process."""
    __slots__ = ("vc",)

    def __init__(self):
        self.vc: dict = {}


def _join(into: dict, other: dict) -> None:
    for k, v in other.items():
        if into.get(k, 0) < v:
            into[k] = v


class Detector(Observer):
    """This process's detector (``RACE``)."""

    order = 0                               # a collective's accesses are known before anything else sees it

    def __init__(self):
        self.configured = False
        self.enabled = False
        self.watching = True                # until configured
        self.mode = "off"
        self._lock = threading.RLock()
        self.clocks: dict = {}              # stream key / host key -> vector clock
        self.events: dict = {}              # (client id, event id) -> clock at its latest record
        self.pending: dict = {}             # stream key -> [_Group] joined at its next task or synchronize
        self.groups: dict = {}              # (comm id, seq) -> _Group
        self.regions: dict = {}             # region key -> [_Access]
        self.allocs: dict = {}              # namespace -> sorted [(start, end)]
        self.reported: set = set()
        self.races: list[str] = []          # raise mode: found, not yet raised
        self.found = 0

    # ---- configuration -------------------------------------------------------------------------------
    def configure(self) -> None:
        text = os.environ.get("NPUSIM_RACE_CHECK", "0").strip().lower()
        self.mode = {"1": "report", "report": "report", "warn": "report", "raise": "raise"}.get(text, "off")
        if text not in ("", "0", "off", "false", "no") and self.mode == "off":
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"NPUSIM_RACE_CHECK={text!r}: expected 0, 1 (report) or raise")
        self.enabled = self.watching = self.mode != "off"
        self.configured = True
        SEAM.refresh()

    def on(self) -> bool:
        if not self.configured:
            self.configure()
        return self.enabled

    # ---- clocks --------------------------------------------------------------------------------------
    @staticmethod
    def _host_key():
        return ("host", threading.get_ident())

    def _clock(self, key) -> dict:
        vc = self.clocks.get(key)
        if vc is None:
            vc = self.clocks[key] = {}
        return vc

    def _stream_key(self, st):
        return (id(st.ctx.client), st.id)

    def _settle(self, skey) -> None:
        """Collectives the stream took part in: by now every local participant has joined their clock."""
        groups = self.pending.pop(skey, None)
        if groups:
            vc = self._clock(skey)
            for g in groups:
                _join(vc, g.vc)

    def _tick_stream(self, st) -> tuple:
        skey = self._stream_key(st)
        self._settle(skey)
        vc = self._clock(skey)
        _join(vc, self._clock(self._host_key()))
        vc[skey] = vc.get(skey, 0) + 1
        return skey, vc

    def _tick_host(self) -> tuple:
        hkey = self._host_key()
        vc = self._clock(hkey)
        vc[hkey] = vc.get(hkey, 0) + 1
        return hkey, vc

    # ---- regions -------------------------------------------------------------------------------------
    def allocated(self, ns: str, start: int, size: int) -> None:
        """Memory at ``start`` was allocated (``ns``: "dev" or "host")."""
        if not self.on():
            return
        with self._lock:
            bisect.insort(self.allocs.setdefault(ns, []), (start, start + size))

    def _region(self, ns: str, start: int, end: int):
        """(region key, region start, region size) of the allocation holding [start, end)."""
        spans = self.allocs.get(ns, ())
        i = bisect.bisect_right(spans, (start, float("inf"))) - 1
        if i >= 0 and spans[i][0] <= start < spans[i][1]:
            a, b = spans[i]
            return (ns, a), a, b - a
        return (ns, start), start, end - start

    # ---- accesses ------------------------------------------------------------------------------------
    def enqueued(self, st, what: str, reads=(), writes=()) -> None:
        if self.on():
            self.task(st, what, reads, writes)

    def host_access(self, what: str, reads=(), writes=()) -> None:
        if self.on():
            self.host(what, reads, writes)

    def task(self, st, what: str, reads=(), writes=(), site=None) -> None:
        """A task enqueued on ``st`` that reads / writes these ``(namespace, address, nbytes)`` ranges."""
        with self._lock:
            skey, vc = self._tick_stream(st)
            where = st                      # formatted only in a report (_where)
            site = site or _site()
            for rng in reads:
                self._access(rng, False, skey, vc, what, where, site)
            for rng in writes:
                self._access(rng, True, skey, vc, what, where, site)

    def host(self, what: str, reads=(), writes=(), site=None) -> None:
        """The calling host thread reads / writes these ranges now (a synchronous copy or memset)."""
        with self._lock:
            hkey, vc = self._tick_host()
            site = site or _site()
            where = threading.current_thread()
            for rng in reads:
                self._access(rng, False, hkey, vc, what, where, site)
            for rng in writes:
                self._access(rng, True, hkey, vc, what, where, site)

    def _access(self, rng, write: bool, key, vc: dict, what: str, where: str, site: str) -> None:
        ns, addr, nbytes = rng
        if nbytes <= 0:
            return
        start, end = addr, addr + nbytes
        rkey, rstart, rsize = self._region(ns, start, end)
        accesses = self.regions.setdefault(rkey, [])
        keep = []
        for a in accesses:
            if a.end <= start or end <= a.start:
                keep.append(a)
                continue
            ordered = a.clock_key == key or vc.get(a.clock_key, 0) >= a.epoch
            if not ordered and (write or a.write):
                self._report(a, _Access(start, end, write, key, vc.get(key, 0), what, where, site), ns, rkey,
                             rstart, rsize)
            # An ordered access that this write covers entirely can never race with anything later.
            if not (ordered and write and start <= a.start and a.end <= end):
                keep.append(a)
        keep.append(_Access(start, end, write, key, vc.get(key, 0), what, where, site))
        if len(keep) > MAX_ACCESSES:
            keep = keep[-MAX_ACCESSES:]
        self.regions[rkey] = keep

    def freeing(self, ns: str, start: int, what: str = "rt.free") -> None:
        """Memory at ``start`` is freed by the calling host thread: every access to it must be ordered before."""
        if not self.on():
            return
        with self._lock:
            spans = self.allocs.get(ns, [])
            i = bisect.bisect_left(spans, (start, -1))
            end = start + 1
            if i < len(spans) and spans[i][0] == start:
                end = spans[i][1]
                del spans[i]
            rkey = (ns, start)
            hkey, vc = self._tick_host()
            site = _site()
            for a in self.regions.pop(rkey, []):
                if a.clock_key != hkey and vc.get(a.clock_key, 0) < a.epoch:
                    self._report(a, _Access(start, end, True, hkey, 0, what, "the host", site), ns, rkey, start,
                                 end - start, free=True)

    # ---- synchronisation -----------------------------------------------------------------------------
    def event_recorded(self, st, ev, task=None) -> None:
        if self.on():
            with self._lock:
                _, vc = self._tick_stream(st)
                self.events[(id(ev.ctx.client), ev.id)] = dict(vc)

    def event_waited(self, st, ev, task=None) -> None:
        if self.on():
            with self._lock:
                _, vc = self._tick_stream(st)
                _join(vc, self.events.get((id(ev.ctx.client), ev.id), {}))

    def synchronized_stream(self, st, call: str | None) -> None:
        if self.on():
            with self._lock:
                skey = self._stream_key(st)
                self._settle(skey)
                _join(self._clock(self._host_key()), self._clock(skey))
            self.check(call)

    def synchronized_device(self, ctx, call: str) -> None:
        if self.on():
            with self._lock:
                cid = id(ctx.client)
                host = self._clock(self._host_key())
                for skey in [k for k in self.clocks if k[0] == cid]:
                    self._settle(skey)
                    _join(host, self.clocks[skey])
            self.check(call)

    def synchronized_event(self, ev, call: str | None) -> None:
        if self.on():
            with self._lock:
                _join(self._clock(self._host_key()), self.events.get((id(ev.ctx.client), ev.id), {}))
            self.check(call)

    def collective(self, st, kind, label, seq, group, params, buffers, calls) -> None:
        """A collective on ``st``: its accesses, then (``seq`` given) a synchronisation with the other local
        members' streams; a transfer between two members (p2p) is a task like any other."""
        if not self.on():
            return
        reads, writes = calls.accesses(kind, label, buffers)
        if seq is None:
            self.task(st, label, reads, writes, site=_site())
            return
        with self._lock:
            self.task(st, f"{label} #{seq} (comm {group.id!r})", reads, writes, site=_site())
            skey = self._stream_key(st)
            g = self.groups.get((group.id, seq))
            if g is None:
                g = self.groups[(group.id, seq)] = _Group()
                if len(self.groups) > 4096:                  # old ones: every participant has settled
                    for k in list(self.groups)[:2048]:
                        del self.groups[k]
            _join(g.vc, self._clock(skey))
            self.pending.setdefault(skey, []).append(g)

    # ---- reporting -----------------------------------------------------------------------------------
    def _report(self, a: _Access, b: _Access, ns, rkey, rstart, rsize, free: bool = False) -> None:
        a_site, b_site, a_where, b_where = _site_text(a.site), _site_text(b.site), _where(a.where), _where(b.where)
        pair = (a_site, b_site, a.what, b.what, a_where, b_where)
        if pair in self.reported:
            return
        self.reported.add(pair)
        self.found += 1
        lo, hi = max(a.start, b.start), min(a.end, b.end)
        region = f"{'device' if ns == 'dev' else 'host'} memory {rkey[1]:#x}"
        if free:
            msg = (f"race: {b.what} at {b_site} frees {region} ({rsize} bytes) while {a.what} on {a_where} "
                   f"at {a_site} ({'writes' if a.write else 'reads'} bytes [{a.start - rstart}, "
                   f"{a.end - rstart})) may still run: synchronize the stream (or wait for an event recorded "
                   f"after it) before freeing")
        else:
            msg = (f"race on {region} (allocation of {rsize} bytes), bytes [{lo - rstart}, {hi - rstart}): "
                   f"{a.what} on {a_where} at {a_site} {'writes' if a.write else 'reads'} them; "
                   f"{b.what} on {b_where} at {b_site} {'writes' if b.write else 'reads'} them; nothing orders "
                   f"the two (no event wait between the streams, no synchronize)")
        if self.mode == "raise":
            self.races.append(msg)
        else:
            warnings.warn(msg, RaceWarning, stacklevel=2)

    def check(self, call: str | None) -> None:
        """Raise mode: the races found since the last check, at a synchronize call (None: not one)."""
        if self.races and call is not None:
            with self._lock:
                races, self.races = self.races, []
            head = f"{call}: the race detector (NPUSIM_RACE_CHECK=raise) found {len(races)} race(s): "
            raise RaceError(head + races[0] + (f" (and {len(races) - 1} more)" if len(races) > 1 else ""), races)


def _site():
    """The innermost frame outside npusim, as (code, line): formatted only in a report (:func:`_site_text`)."""
    f = callsite.outside(sys._getframe(1))
    return None if f is None else (f.f_code, f.f_lineno)


def _site_text(site) -> str:
    return callsite.text(*site) if isinstance(site, tuple) else str(site)


def _where(where) -> str:
    if isinstance(where, str):
        return where
    if isinstance(where, threading.Thread):
        return f"the host (thread {where.name})"
    return f"stream {where.id} of {where.ctx.client.name}" if where.id else f"the default stream of {where.ctx.client.name}"


RACE = Detector()
SEAM.register(RACE)
