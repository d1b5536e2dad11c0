"""One exception tree for the whole product, carrying the real numeric codes.

``NpuError(RuntimeError)`` has ``.code``; ``AclError`` carries an ``aclError`` code (runtime). A package above
rt derives its own class (``hccl.HcclError``, an ``HcclResult`` code) and registers its ``kind`` with
:func:`register_kind` in every process that may see it. Errors cross process boundaries (card actor → host) as
``(kind, code, message)`` triples, see :func:`to_wire` / :func:`from_wire`: each side rebuilds the class
registered for the kind.
"""

from __future__ import annotations

import threading

from .diag import slog

# CANN's error-code tag of a failed memory allocation; npusim's own text (what, how much) follows it.
EL0004 = "EL0004: Failed to allocate memory."


def oom_message(card: int, node: int, nbytes: int, rounded: int, allocated: int, reserved: int, capacity: int) -> str:
    """The text of a malloc that does not fit on a full card (``rt/card/blocks.py``; injected:
    ``rt/diag/faults.py``)."""
    return (f"{EL0004} malloc: out of memory on card {card} (node {node}): requested {nbytes} bytes (rounded "
            f"{rounded}); allocated {allocated}, reserved {reserved} (cached {reserved - allocated}), capacity {capacity}")


class NpuError(RuntimeError):
    """Base of every npusim error; ``code`` is the real numeric code (ACL's, or the package's that raised it).
    ``kind`` names the class on the wire, ``log_module`` is the CANN module tag of its log lines; for the
    diagnostics, ``job_wide`` says the failure concerns the job's other processes too (a collective: every rank's
    flight recorder dumps) and ``from_peers`` that it may be another process's doing (a peer that never came
    or died)."""

    kind = "npu"
    log_module = slog.RUNTIME
    job_wide = False
    from_peers = False

    def __init__(self, code: int, message: str):
        super().__init__(f"[{code}] {message}")
        self.code = int(code)
        self.message = message

    def __reduce__(self):
        return (type(self), (self.code, self.message))


class AclError(NpuError):
    """A runtime (ACL) failure; ``code`` is an ``aclError`` value such as 207001."""

    kind = "acl"


_KINDS: dict[str, type] = {NpuError.kind: NpuError, AclError.kind: AclError}


def register_kind(cls: type) -> type:
    """Rebuild errors of ``cls.kind`` coming over the wire as ``cls`` in this process (a class decorator)."""
    _KINDS[cls.kind] = cls
    return cls


def to_wire(exc: BaseException) -> list:
    """Encode an exception for the command channel; non-npusim exceptions become 507000-class."""
    if isinstance(exc, NpuError):
        return [exc.kind, exc.code, exc.message]
    return ["acl", 507000, f"internal error on the card: {type(exc).__name__}: {exc}"]


def from_wire(triple) -> NpuError:
    kind, code, message = triple
    return _KINDS.get(kind, NpuError)(code, message)


# get_recent_err_msg(): per-thread text of the most recent failure, read-and-clear as in ACL.
_recent = threading.local()


def record_error_message(text: str, dedupe: bool = False, module=None) -> None:
    """Add ``text`` as this thread's newest error message (``dedupe``: unless it is already the newest), and
    log it at ERROR (rt/diag/slog.py; ``module``: the tag, or the error whose type gives it)."""
    prev = getattr(_recent, "text", None)
    if dedupe and prev is not None and (prev == text or prev.startswith(text + "\n")):
        return
    _recent.text = text if not prev else f"{text}\n{prev}"
    slog.record_error(text, module)


def get_recent_err_msg() -> str | None:
    """Return and clear this thread's accumulated error text (newest first), or None."""
    text = getattr(_recent, "text", None)
    _recent.text = None
    return text
