"""The fault-injection spec language (``NPUSIM_FAULTS`` / ``launch --inject`` / ``rt.faults.inject``): its actions,
their keys, and the parser that turns a SPEC into :class:`Fault` objects or refuses it with 100000 naming the bad
part. What the faults do when a call reaches them is ``rt/diag/faults.py``; the grammar is in its docstring.
"""

from __future__ import annotations

import dataclasses

from ..args import shown
from ..constants import AclErrorCode
from ..errors import AclError


@dataclasses.dataclass(frozen=True)
class FailureCodes:
    """The codes a ``fail`` fault may give (``code=X``, a name or a number), as the package whose collectives fail
    with them registers them (:func:`register_codes`; HCCL's ``HcclResult``: ``hccl/diag.py``)."""

    by_name: dict[str, int]
    what: str                        # how a refusal names them ("is not <what>")


CODES: FailureCodes | None = None   # None: no such package in this process yet (a code is checked when it fires)


def register_codes(by_name: dict[str, int], what: str) -> None:
    global CODES
    CODES = FailureCodes(dict(by_name), what)


_CALL_TRIGGERS = ("collective", "p2p")
_LIMIT = 1 << 31


@dataclasses.dataclass(frozen=True)
class _Action:
    target: str                      # "rank" or "card"
    triggers: tuple[str, ...]        # exactly one of them is given (ecc: sync, optional)
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()


ACTIONS = {
    "kill": _Action("rank", _CALL_TRIGGERS),
    "kill_card": _Action("card", _CALL_TRIGGERS, optional=("node",)),
    "hang": _Action("rank", _CALL_TRIGGERS),
    "delay": _Action("rank", _CALL_TRIGGERS, required=("ms",)),
    "fail": _Action("rank", _CALL_TRIGGERS, required=("code",)),
    "corrupt": _Action("rank", _CALL_TRIGGERS, optional=("bytes",)),
    "oom": _Action("card", ("malloc",), optional=("node",)),
    "ecc": _Action("card", ("sync",), optional=("node",)),
}


@dataclasses.dataclass(eq=False)
class Fault:
    """One parsed fault; ``seen`` counts the matching calls so far (K-th: ``seen == at``)."""

    action: str
    text: str                        # the fault as written (whitespace trimmed): what messages quote
    rank: int | None = None
    card: int | None = None
    node: int = 0
    trigger: str = "collective"      # collective | p2p | malloc | sync
    at: int = 1
    ms: int = 0
    code: int | str = 0              # fail: a number (a name only until its package registers: code_of)
    nbytes: int = 0                  # corrupt: 0 = every received byte
    restart: int = 0
    seen: int = 0

    @property
    def who(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"card {self.card} (node {self.node})"


def _bad(source: str, text: str, why: str) -> AclError:
    return AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM, f"{source}: bad fault {shown(text)}: {why}")


def _digits(value: str) -> bool:
    """ASCII digits short enough for int(): '²' is isdigit() but not int()-able, and int() refuses > 4300 digits."""
    return value.isascii() and value.isdigit() and len(value) <= 20


def _number(source, text, key, value, lo, hi=_LIMIT) -> int:
    if not _digits(value) or not lo <= int(value) < hi:
        raise _bad(source, text, f"{key}={shown(value)} is not a number in {lo}..{hi - 1}")
    return int(value)


def _code(source, text, value) -> int | str:
    """A ``code=`` value: its number; as written (upper case) while no package registered its codes."""
    if CODES is None:
        return int(value) if _digits(value) else value.upper()
    if _digits(value):
        if int(value) in CODES.by_name.values():
            return int(value)
    elif value.upper() in CODES.by_name:
        return CODES.by_name[value.upper()]
    raise _bad(source, text, f"code={shown(value)} is not {CODES.what}")


def code_of(f: Fault, source: str) -> int:
    """The number of a ``fail`` fault's code, checked now if it was parsed before its package registered."""
    return f.code if isinstance(f.code, int) else _code(source, f.text, f.code)


def _parse_one(text: str, source: str) -> Fault:
    head, *pairs = text.split(":")
    action = head.strip()
    spec = ACTIONS.get(action)
    if spec is None:
        raise _bad(source, text, f"unknown action {action!r} (expected one of {', '.join(ACTIONS)})")
    allowed = (spec.target, *spec.triggers, *spec.required, *spec.optional, "restart")
    keys: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise _bad(source, text, f"{pair.strip()!r} is not key=value")
        if key not in allowed:
            raise _bad(source, text, f"unknown key {key!r} for {action} (expected {', '.join(allowed)})")
        if key in keys:
            raise _bad(source, text, f"key {key!r} is given twice")
        keys[key] = value
    for key in (spec.target, *spec.required):
        if key not in keys:
            raise _bad(source, text, f"missing key {key!r} ({action} needs {spec.target}=, "
                                     f"{' or '.join(k + '=' for k in spec.triggers)}"
                                     f"{''.join(', ' + k + '=' for k in spec.required)})")
    triggers = [k for k in spec.triggers if k in keys]
    if len(triggers) > 1:
        raise _bad(source, text, f"give one of {' and '.join(k + '=' for k in triggers)}, not both")
    if not triggers and action != "ecc":
        raise _bad(source, text, f"missing key {' or '.join(repr(k) for k in spec.triggers)} (which call to hit)")
    f = Fault(action, text.strip())
    f.trigger = triggers[0] if triggers else "sync"
    f.at = _number(source, text, f.trigger, keys[f.trigger], 1) if triggers else 1
    if spec.target == "rank":
        f.rank = _number(source, text, "rank", keys["rank"], 0)
    else:
        f.card = _number(source, text, "card", keys["card"], 0)
        f.node = _number(source, text, "node", keys.get("node", "0"), 0)
    f.restart = _number(source, text, "restart", keys.get("restart", "0"), 0)
    if "ms" in keys:
        f.ms = _number(source, text, "ms", keys["ms"], 0, 86_400_001)
    if "bytes" in keys:
        f.nbytes = _number(source, text, "bytes", keys["bytes"], 1)
    if "code" in keys:
        f.code = _code(source, text, keys["code"])
    return f


def parse(spec: str, source: str = "NPUSIM_FAULTS") -> list[Fault]:
    """The faults of ``spec`` (empty parts between ``;`` are ignored); ``AclError`` 100000
    (``ACL_ERROR_INVALID_PARAM``) naming the bad part and what is wrong with it."""
    if not isinstance(spec, str):
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM, f"{source}: {spec!r} is not a fault spec string")
    return [_parse_one(part, source) for part in spec.split(";") if part.strip()]
