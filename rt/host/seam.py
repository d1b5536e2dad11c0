"""The observer seam: what the host side tells the diagnostics about each call, through one small interface.

Emitters — rt's host calls (``streams.py``, ``memory.py``, ``tensor.py``, ...) and the packages above rt (HCCL's
collectives: ``hccl/api.py``) — call ``SEAM.<event>(...)`` behind one check, ``if SEAM.on:``. Observers — the
flight recorder, the race detector, fault injection (``rt/diag/``) — subclass :class:`Observer`, override the
events they watch and :meth:`Seam.register` themselves; the seam calls, for each event, only the observers that
override it, in their ``order``, and skips one whose ``watching`` is False. An observer that changes
``watching`` calls :meth:`Seam.refresh`, so that with nothing watching an event costs the emitter one attribute
check, and an event one observer watches is a direct call of that observer's method. Range lists cost an allocation per call, so their emitters check ``SEAM.accesses`` instead (some
watching observer takes ``enqueued`` or ``host_access``: the race detector); a synchronize, the end of every
step of a loop, checks ``SEAM.syncs`` (some watching observer takes ``synchronizing`` or a ``synchronized_*``
event), which the always-on flight recorder leaves False.

Accesses are ``(kind, address, nbytes)`` ranges, kind ``"dev"`` (device memory) or ``"host"``. A collective
event carries its package's fields: ``kind`` ``"collective"`` (every member of ``group`` calls it, in the same
order: it orders their streams) or ``"p2p"`` (a transfer between two members); ``label`` (the call), ``seq``
(its number on the group; None for p2p), ``group`` (an object with ``id``, ``rank`` and ``size``), ``params``
(the call's parameters as they go to the card; an observer may add ``params["fault"]``, the card's part of an
injected fault, and the call must then go to the card), ``buffers`` and ``calls``, the package's description
of its calls: ``calls.accesses(kind, label, buffers)`` → ``(reads, writes)`` and ``calls.fields(kind, group,
params, buffers)`` → the fields a dump shows, both asked only by an observer that needs them.

One observer may follow a wait or a collective to its end (the flight recorder): the one that overrides
:meth:`Observer.waited` / :meth:`Observer.placed` and returns a token from the event that starts it.
"""

from __future__ import annotations

import numpy as np

_EVENTS = ("starting", "enqueued", "host_access", "allocating", "allocated", "freeing", "synchronizing", "waiting",
           "synchronized_stream", "synchronized_device", "synchronized_event", "event_recorded", "event_waited",
           "collective")


class Observer:
    """A diagnostic watching the host: every event does nothing until overridden."""

    order = 0            # observers see an event in ascending order
    watching = True      # False: skip this observer (set, then call SEAM.refresh())
    adds_to_params = False   # its ``collective`` may add to the call's ``params``: the emitter then passes a copy

    def starting(self) -> None:
        """``rt.init``: read the configuration now (an error raised here fails the init); called whether or not
        the observer is watching."""

    def enqueued(self, stream, what: str, reads=(), writes=()) -> None:
        """A task was put on ``stream``, reading and writing these ranges when it runs."""

    def host_access(self, what: str, reads=(), writes=()) -> None:
        """The calling host thread reads and writes these ranges now (a synchronous copy or memset)."""

    def allocating(self, ctx, nbytes: int) -> None:
        """A device malloc on ``ctx``'s card is about to be asked for (raising here fails it)."""

    def allocated(self, kind: str, address: int, nbytes: int) -> None:
        """Memory was allocated (device memory or a pinned host buffer)."""

    def freeing(self, kind: str, address: int, what: str) -> None:
        """The calling host thread frees the allocation at ``address`` (``what``: the call)."""

    def synchronizing(self, ctx, call: str) -> None:
        """A synchronize on ``ctx``'s card is about to wait (raising here fails it)."""

    def waiting(self, op: str, stream, fields: dict):
        """A blocking wait on ``stream`` begins; a token returned here (by the one observer that follows waits)
        comes back to :meth:`waited`."""

    def waited(self, token, error: BaseException | None) -> None:
        """The wait of ``token`` returned (``error``: what it raised)."""

    def synchronized_stream(self, stream, call: str | None) -> None:
        """The host saw everything on ``stream`` finish: ``call`` is the synchronize (None: a query saw it)."""

    def synchronized_device(self, ctx, call: str) -> None:
        """The host saw every stream of ``ctx`` finish."""

    def synchronized_event(self, event, call: str | None) -> None:
        """The host saw ``event``'s latest record complete (None: a query saw it)."""

    def event_recorded(self, stream, event, task: int) -> None:
        """``event`` was recorded on ``stream`` (as stream task ``task``)."""

    def event_waited(self, stream, event, task: int) -> None:
        """``stream`` waits for ``event`` (as stream task ``task``)."""

    def collective(self, stream, kind: str, label: str, seq, group, params: dict, buffers, calls):
        """A collective call enters (see the module docstring); a token returned here (by the one observer that
        follows calls) comes back to :meth:`placed`."""

    def placed(self, token, task: int | None, on_host: bool) -> None:
        """The collective of ``token`` returned: it went to stream task ``task``, or ran to completion in this
        process (``on_host``)."""


class Seam:
    """The host's seam (``SEAM``): registered observers, and one method per event that calls them."""

    def __init__(self):
        self.on = True                 # some observer is watching (the emitters' check)
        self.copy_params = False       # a watching observer may add to a collective's params: pass it a copy
        self.accesses = False          # some watching observer wants the ranges of enqueued / host_access (the
                                       # emitters' check before they build the range lists)
        self.syncs = False             # some watching observer takes synchronizing / synchronized_* (the check of
                                       # the synchronize calls)
        self.observers: list[Observer] = []
        for event in _EVENTS:
            setattr(self, f"_{event}", ())
        self._waited = self._placed = None          # the observer that follows waits and calls to their end

    def register(self, observer: Observer) -> None:
        """Add ``observer``: each event calls it if its class overrides that event."""
        for end in ("waited", "placed"):
            if _overrides(observer, end) and getattr(self, f"_{end}") is not None:
                raise ValueError(f"{type(observer).__name__}: another observer already follows calls ({end})")
        self.observers.append(observer)
        self.observers.sort(key=lambda o: o.order)
        for event in _EVENTS:
            setattr(self, f"_{event}", tuple(o for o in self.observers if _overrides(o, event)))
        for end in ("waited", "placed"):
            setattr(self, f"_{end}", next((o for o in self.observers if _overrides(o, end)), None))
        self.refresh()

    def refresh(self) -> None:
        """An observer's ``watching`` changed: recompute the emitters' checks and each event's dispatch. An event
        that one watching observer takes goes straight to that observer's method (no loop, no ``watching``
        checks: with only the flight recorder on, a collective costs its entry and nothing more); one that no
        watching observer takes does nothing; otherwise the loop below runs."""
        self.on = any(o.watching for o in self.observers)
        self.copy_params = any(o.watching and o.adds_to_params for o in self._collective)
        self.accesses = any(o.watching for o in self._enqueued + self._host_access)
        self.syncs = any(o.watching for o in self._synchronizing + self._synchronized_stream +
                         self._synchronized_device + self._synchronized_event)
        for event in _EVENTS[1:]:                       # "starting" goes to every observer, watching or not
            takers = [o for o in getattr(self, f"_{event}") if o.watching]
            if len(takers) == 1:
                setattr(self, event, getattr(takers[0], event))
            elif takers:
                self.__dict__.pop(event, None)          # the class's method: every taker, in order
            else:
                setattr(self, event, getattr(_IDLE, event))     # the base class's: does nothing
        for end in ("waited", "placed"):                # the one observer that follows calls to their end
            follower = getattr(self, f"_{end}")
            if follower is not None:
                setattr(self, end, getattr(follower, end))

    # -- events (see Observer) -------------------------------------------------------------------------
    def starting(self) -> None:
        for o in self._starting:
            o.starting()

    def enqueued(self, stream, what: str, reads=(), writes=()) -> None:
        for o in self._enqueued:
            if o.watching:
                o.enqueued(stream, what, reads, writes)

    def host_access(self, what: str, reads=(), writes=()) -> None:
        for o in self._host_access:
            if o.watching:
                o.host_access(what, reads, writes)

    def allocating(self, ctx, nbytes: int) -> None:
        for o in self._allocating:
            if o.watching:
                o.allocating(ctx, nbytes)

    def allocated(self, kind: str, address: int, nbytes: int) -> None:
        for o in self._allocated:
            if o.watching:
                o.allocated(kind, address, nbytes)

    def freeing(self, kind: str, address: int, what: str) -> None:
        for o in self._freeing:
            if o.watching:
                o.freeing(kind, address, what)

    def synchronizing(self, ctx, call: str) -> None:
        for o in self._synchronizing:
            if o.watching:
                o.synchronizing(ctx, call)

    def waiting(self, op: str, stream, fields: dict):
        """The token to give :meth:`waited` when the wait returns; None: nobody follows it."""
        token = None
        for o in self._waiting:
            if o.watching:
                t = o.waiting(op, stream, fields)
                if t is not None:
                    token = t
        return token

    def waited(self, token, error: BaseException | None = None) -> None:
        self._waited.waited(token, error)

    def synchronized_stream(self, stream, call: str | None) -> None:
        for o in self._synchronized_stream:
            if o.watching:
                o.synchronized_stream(stream, call)

    def synchronized_device(self, ctx, call: str) -> None:
        for o in self._synchronized_device:
            if o.watching:
                o.synchronized_device(ctx, call)

    def synchronized_event(self, event, call: str | None) -> None:
        for o in self._synchronized_event:
            if o.watching:
                o.synchronized_event(event, call)

    def event_recorded(self, stream, event, task: int) -> None:
        for o in self._event_recorded:
            if o.watching:
                o.event_recorded(stream, event, task)

    def event_waited(self, stream, event, task: int) -> None:
        for o in self._event_waited:
            if o.watching:
                o.event_waited(stream, event, task)

    def collective(self, stream, kind: str, label: str, seq, group, params: dict, buffers, calls):
        """The token to give :meth:`placed` when the call returns; None: nobody follows it."""
        token = None
        for o in self._collective:
            if o.watching:
                t = o.collective(stream, kind, label, seq, group, params, buffers, calls)
                if t is not None:
                    token = t
        return token

    def placed(self, token, task: int | None, on_host: bool = False) -> None:
        self._placed.placed(token, task, on_host)


def _overrides(observer: Observer, event: str) -> bool:
    return getattr(type(observer), event) is not getattr(Observer, event)


_IDLE = Observer()           # its events, which do nothing, are those of the events no watching observer takes
SEAM = Seam()


def dev(ptr: int, nbytes: int) -> tuple:
    """A device range, as the access events carry it."""
    return ("dev", int(ptr), int(nbytes))


def host(view, nbytes: int) -> tuple:
    """A host range: the memory of a numpy array, a buffer view or a pinned ``HostBuffer``."""
    if not isinstance(view, np.ndarray):
        view = np.frombuffer(view, np.uint8)
    return ("host", int(view.ctypes.data), int(nbytes))
