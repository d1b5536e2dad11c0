"""One exception tree for the whole product, carrying the real ACL / HCCL numeric codes.

``NpuError(RuntimeError)`` has ``.code``; ``AclError`` carries an ``aclError`` code (runtime),
``HcclError`` an ``HcclResult`` code (collectives). Errors cross process boundaries (card actor →
host) as ``(kind, code, message)`` triples, see :func:`to_wire` / :func:`from_wire`.
"""

from __future__ import annotations

import threading

from . import slog

# CANN's error-code tag of a failed memory allocation; npusim's own text (what, how much) follows it.
EL0004 = "EL0004: Failed to allocate memory."


def oom_message(card: int, node: int, nbytes: int, rounded: int, allocated: int, reserved: int, capacity: int) -> str:
    """The text of a malloc that does not fit on a full card (``rt/card/blocks.py``; injected: ``rt/faults.py``)."""
    return (f"{EL0004} malloc: out of memory on card {card} (node {node}): requested {nbytes} bytes (rounded "
            f"{rounded}); allocated {allocated}, reserved {reserved} (cached {reserved - allocated}), capacity {capacity}")


class NpuError(RuntimeError):
    """Base of every npusim error; ``code`` is the real numeric ACL or HCCL code."""

    kind = "npu"

    def __init__(self, code: int, message: str):
        super().__init__(f"[{code}] {message}")
        self.code = int(code)
        self.message = message

    def __reduce__(self):
        return (type(self), (self.code, self.message))


class AclError(NpuError):
    """A runtime (ACL) failure; ``code`` is an ``aclError`` value such as 207001."""

    kind = "acl"


class HcclError(NpuError):
    """A collective (HCCL) failure; ``code`` is an ``HcclResult`` value such as 9 (timeout)."""

    kind = "hccl"


_KINDS = {cls.kind: cls for cls in (NpuError, AclError, HcclError)}


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
    log it at ERROR (rt/slog.py; ``module``: the tag, or the error whose type gives it)."""
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
