"""Fault injection for testing recovery code: ``NPUSIM_FAULTS=SPEC``, ``launch --inject SPEC``, ``rt.faults.inject``.

SPEC is a ``;``-separated list of faults, each ``action:key=value:key=value...`` (docs/faults.md has a worked
example of each)::

    kill:rank=R:collective=K          SIGKILL rank R's process as it enters its K-th collective
    kill_card:card=C:collective=K     SIGKILL the process of card C as the rank on it enters its K-th collective
    hang:rank=R:collective=K          rank R blocks forever entering its K-th collective
    delay:rank=R:collective=K:ms=T    rank R enters its K-th collective T ms late
    fail:rank=R:collective=K:code=X   that collective fails with code X on rank R (a name or number of its
                                      package's codes: HCCL's HcclResult)
    corrupt:rank=R:collective=K       the bytes rank R receives from that collective are inverted (bytes=N: the
                                      first N only)
    oom:card=C:malloc=K               the K-th malloc of this process on card C fails with 207001
    ecc:card=C                        a device error (507054, HBM multi-bit ECC) at the next synchronize on card C
                                      (sync=K: the K-th)

Every fault takes ``restart=N`` (default 0): it applies only while ``RESTART_COUNT`` is N, so the run that
``launch --max-restarts`` starts after the failure runs clean. ``collective=K`` counts the collectives the
process calls (all_reduce ... barrier, over all its communicators, from 1); send/recv/batch_send_recv calls
are counted apart, as ``p2p=K`` (each call one), usable in place of ``collective=K``. A rank is the process's
``RANK`` (set by ``launch``/``spawn``/torchrun); in a process without ``RANK`` (one process driving several
cards) it is the communicator rank of the call. A card is the physical card index on its node (what error
messages and ``npu-smi`` call ``card C``; ``node=N``, default 0, picks the node).

The environment is read when the runtime starts (``rt.init``; a malformed SPEC fails there with 100000) or at
the first call that could inject, never at import (ranks are forked from a pre-imported server). Fault injection
observes the host through the seam (``rt/host/seam.py``): with no fault for this process it is not ``watching``
and costs a call nothing. The collectives' package carries out the card's part of ``fail`` and ``corrupt``
(``params["fault"]``: HCCL's is ``hccl/card/faults.py``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from ..constants import AclErrorCode
from ..errors import AclError, NpuError, oom_message, record_error_message
from ..host.runtime import RUNTIME
from ..host.seam import SEAM, Observer
from ..wire import client
from . import slog
from .faultspec import _CALL_TRIGGERS, ACTIONS, Fault, _digits, code_of, parse  # noqa: F401  ACTIONS: re-exported

# The ECC fault's code: ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR, "hbm Multi-bit ECC error" (rt_error_codes.h). Real
# runtimes report the device reason as "reason=[hbm Multi-bit ECC error]" (torch_npu greps it: HBM_ECC_EXIT).
ECC_CODE = AclErrorCode.ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR
ECC_REASON = "reason=[hbm Multi-bit ECC error]"

_PEER_VISIBLE = ("kill", "kill_card", "hang", "delay")     # peers' errors mention these (see _peer_note)


def _env_int(name: str) -> int | None:
    text = os.environ.get(name, "").strip()
    return int(text) if _digits(text) else None


def _say(line: str) -> None:
    """The line that says a fault was injected: on stderr (a rank's is prefixed by launch), and in the plog."""
    slog.warning(slog.RUNTIME, "%s", line)
    try:
        sys.stdout.flush()
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class Faults(Observer):
    """This process's faults (``FAULTS``). ``armed`` (the seam's ``watching``): False once configured with nothing
    that can fire here."""

    order = 2                             # last: a fault may stop the process, the other observers have the call
    adds_to_params = True                 # the card's part of a fault goes to params["fault"]

    def __init__(self):
        self.watching = True              # unconfigured: the first call that could inject reads the environment
        self.configured = False
        self.source: str | None = None    # "env" or "api"
        self.label = "NPUSIM_FAULTS"
        self.spec = ""
        self.faults: list[Fault] = []     # every fault of the spec
        self.calls: list[Fault] = []      # this process's collective / p2p faults of this restart
        self.mallocs: list[Fault] = []
        self.syncs: list[Fault] = []
        self.notes: list[Fault] = []      # other ranks' process faults, mentioned in this rank's peer errors
        self.process_rank: int | None = None
        self.restart = 0
        self._hooked = False
        self._lock = threading.RLock()

    @property
    def armed(self) -> bool:
        return self.watching

    # -- configuration ---------------------------------------------------------------------------------
    def configure(self) -> None:
        """Read ``NPUSIM_FAULTS`` (unless faults were set through :func:`inject`)."""
        with self._lock:
            if self.source == "api":
                self.configured = True
                return
            spec = os.environ.get("NPUSIM_FAULTS", "")
            self._install(parse(spec), spec, "NPUSIM_FAULTS", "env")

    def reset(self) -> None:
        """Forget the configuration (the next call reads ``NPUSIM_FAULTS`` again)."""
        with self._lock:
            self._install([], "", "NPUSIM_FAULTS", None)
            self.configured = False
            self.watching = True
            SEAM.refresh()

    def _install(self, faults: list[Fault], spec: str, label: str, source: str | None) -> None:
        self.faults, self.spec, self.label, self.source = faults, spec, label, source
        self.process_rank = _env_int("RANK")
        self.restart = _env_int("RESTART_COUNT") or 0
        live = [f for f in faults if f.restart == self.restart]
        for f in live:
            f.seen = 0
        mine = [f for f in live if f.rank is None or self.process_rank is None or f.rank == self.process_rank]
        self.calls = [f for f in mine if f.trigger in _CALL_TRIGGERS]
        self.mallocs = [f for f in mine if f.trigger == "malloc"]
        self.syncs = [f for f in mine if f.trigger == "sync"]
        self.notes = [f for f in live if f.action in _PEER_VISIBLE and self.process_rank is not None
                      and f.rank != self.process_rank]
        if self.notes and not self._hooked:
            client.ERROR_HOOKS.append(self._peer_note)
            self._hooked = True
        elif not self.notes and self._hooked:
            client.ERROR_HOOKS.remove(self._peer_note)
            self._hooked = False
        self.watching = bool(self.calls or self.mallocs or self.syncs)
        self.configured = True
        SEAM.refresh()

    def active(self) -> list[str]:
        """The faults that apply to this process in this restart, as written."""
        if not self.configured:
            self.configure()
        return [f.text for f in self.calls + self.mallocs + self.syncs]

    def note(self, f: Fault) -> str:
        return f"(injected by {self.label}: {f.text})"

    # -- hooks (called only while armed) ---------------------------------------------------------------
    def _hits(self, faults: list[Fault], trigger: str, ctx, comm_rank: int | None = None) -> list[Fault]:
        hits = []
        with self._lock:
            for f in faults:
                if f.trigger != trigger:
                    continue
                if f.rank is not None and self.process_rank is None and comm_rank != f.rank:
                    continue
                if f.card is not None and (ctx.node, ctx.physical) != (f.node, f.card):
                    continue
                f.seen += 1
                if f.seen == f.at:
                    hits.append(f)
        return hits

    def collective(self, st, kind, label, seq, group, params, buffers, calls) -> None:
        """A collective (``kind`` "collective") or send/recv ("p2p") entering: this process's faults on it fire; what
        the card must do (fail, corrupt) goes to ``params["fault"]``."""
        if not self.configured:
            self.configure()
        hits = self._hits(self.calls, kind, st.ctx, group.rank) if self.calls else None
        if hits:
            what = f"{label} #{seq} on comm '{group.id}'" if seq is not None else f"{label} on comm '{group.id}'"
            wire = self._fire(hits, st.ctx, group.rank, what)
            if wire:
                params["fault"] = wire

    def _fire(self, hits: list[Fault], ctx, member: int, what: str) -> list[dict]:
        """Delays first, then what the card does (fail, corrupt: returned), then what never returns."""
        rank = self.process_rank if self.process_rank is not None else member
        order = {"delay": 0, "fail": 1, "corrupt": 1, "kill_card": 2, "kill": 3, "hang": 3}
        wire = []
        for f in sorted(hits, key=lambda f: order[f.action]):
            enters = f"enters {what} (its {f.trigger} #{f.at})"
            if f.action == "delay":
                _say(f"npusim: rank {rank} waits {f.ms} ms as it {enters} {self.note(f)}")
                time.sleep(f.ms / 1000)
            elif f.action == "fail":
                wire.append({"action": "fail", "code": code_of(f, self.label), "note": self.note(f)})
            elif f.action == "corrupt":
                _say(f"npusim: rank {rank} will receive inverted bytes from {what} (its {f.trigger} #{f.at}) "
                     f"{self.note(f)}")
                wire.append({"action": "corrupt", "bytes": f.nbytes, "note": self.note(f)})
            elif f.action == "kill_card":
                self._kill_card(ctx, rank, enters, f)
            elif f.action == "kill":
                _say(f"npusim: rank {rank} (pid {os.getpid()}) killed with SIGKILL as it {enters} {self.note(f)}")
                os.kill(os.getpid(), signal.SIGKILL)
            elif f.action == "hang":
                _say(f"npusim: rank {rank} (pid {os.getpid()}) hangs forever as it {enters} {self.note(f)}")
                while True:                 # interruptible: launch's SIGTERM still ends (and dumps) the rank
                    time.sleep(3600)
        return wire

    def _kill_card(self, ctx, rank: int, enters: str, f: Fault) -> None:
        pid = (ctx.client.info or {}).get("pid")
        if pid is None or pid == os.getpid():   # cards inside this process (backend="local"): it is the card's
            _say(f"npusim: card {f.card} (node {f.node}) runs in this process (pid {os.getpid()}): killed with "
                 f"SIGKILL as rank {rank} {enters} {self.note(f)}")
            os.kill(os.getpid(), signal.SIGKILL)
        _say(f"npusim: card {f.card} (node {f.node}) process (pid {pid}) killed with SIGKILL as rank {rank} "
             f"{enters} {self.note(f)}")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10   # as when a card dies for real: this rank's channel to it closes
        while not ctx.client.lost and time.monotonic() < deadline:
            time.sleep(0.005)

    def starting(self) -> None:
        """``rt.init``: read the environment now, so a malformed spec fails at start."""
        with self._lock:
            if self.source != "api":
                self.reset()
                self.configure()

    def allocating(self, ctx, size: int) -> None:
        """``rt.malloc`` on ``ctx``'s card: raise the out-of-memory error of a full card at the K-th one."""
        if not self.configured:
            self.configure()
        hits = self._hits(self.mallocs, "malloc", ctx) if self.mallocs else None
        if not hits:
            return
        try:
            stats = ctx.client.call("memory_stats")
            allocated, reserved = stats["allocated_bytes.all.current"], stats["reserved_bytes.all.current"]
        except (NpuError, KeyError):
            allocated = reserved = 0
        rounded = ((size - 1) // 32 + 1) * 32 + 32
        capacity = (ctx.client.info or {}).get("total_memory", 0)
        self._surface(AclError(AclErrorCode.ACL_ERROR_RT_MEMORY_ALLOCATION,
                               f"{oom_message(ctx.physical, ctx.node, size, rounded, allocated, reserved, capacity)} "
                               f"{self.note(hits[0])}"))

    def synchronizing(self, ctx, call: str) -> None:
        """A synchronize on ``ctx``'s card (``rt/host/streams.py``): the ECC error at the K-th one."""
        if not self.configured:
            self.configure()
        hits = self._hits(self.syncs, "sync", ctx) if self.syncs else None
        if hits:
            self._surface(AclError(ECC_CODE, f"{call}: EZ9999: Inner Error! The error from device (card "
                                             f"{ctx.physical}, node {ctx.node}): multi-bit ECC error in HBM, "
                                             f"{ECC_REASON}; the card's memory contents are lost, reset the device "
                                             f"{self.note(hits[0])}"))

    @staticmethod
    def _surface(err: NpuError):
        """Raise ``err`` as a card's answer is raised (rt/wire/client.py): recorded for get_recent_err_msg and the
        plog, and shown to the error hooks (the flight recorder)."""
        record_error_message(err.message, module=err)
        for hook in client.ERROR_HOOKS:
            hook(err)
        raise err

    def _peer_note(self, err) -> None:
        """An error that may come from a peer (a timeout, a dead peer: ``from_peers``) while another rank or card
        has an injected process fault: say so."""
        if not getattr(err, "from_peers", False):
            return
        mine = {(c.node, c.physical) for c in list(RUNTIME.contexts)}
        notes = [f"{f.who} is under an injected fault, {self.label}: {f.text}" for f in self.notes
                 if f.card is None or (f.node, f.card) not in mine]
        if notes and "is under an injected fault" not in err.message:
            err.message = f"{err.message} ({'; '.join(notes)})"
            err.args = (f"[{err.code}] {err.message}",)


FAULTS = Faults()
SEAM.register(FAULTS)


class Injection:
    """What :func:`inject` returns: the faults are in effect already; as a context manager, ``with`` ends them
    (restoring what was in effect before)."""

    def __init__(self, previous: tuple):
        self.previous = previous

    def __enter__(self) -> "Injection":
        return self

    def __exit__(self, *exc) -> None:
        spec, label, source = self.previous
        with FAULTS._lock:
            if source == "api":
                FAULTS._install(parse(spec, label), spec, label, "api")
            else:
                FAULTS.reset()


def inject(spec: str) -> Injection:
    """Put the faults of ``spec`` in effect in this process now (counting from the next call), instead of
    ``NPUSIM_FAULTS``; ``RANK`` and ``RESTART_COUNT`` of the environment apply as for ``NPUSIM_FAULTS``.
    ``with rt.faults.inject("oom:card=0:malloc=2"): ...`` ends them on exit. Raises 100000 on a malformed spec."""
    faults = parse(spec, "rt.faults.inject")
    with FAULTS._lock:
        previous = (FAULTS.spec, FAULTS.label, FAULTS.source)
        FAULTS._install(faults, spec, "rt.faults.inject", "api")
    return Injection(previous)


def clear() -> None:
    """End faults set with :func:`inject`; ``NPUSIM_FAULTS`` is read again at the next call."""
    FAULTS.reset()


def active() -> list[str]:
    """The faults in effect for this process in this restart, as written."""
    return FAULTS.active()
