"""Which packages extend the card, declared by name so both ends of the wire agree without importing them.

A package above the runtime (HCCL, the pyACL helpers, a recorder) declares, in the process that uses it,
``declare("hccl", "hccl.card.extension:HcclExtension")``: commands and tasks named ``hccl_<name>`` are then
handled on every card by the entries of that class's command and task tables (``rt/card/extension.py``).
Declarations travel to the cards with the first command after they change (``rt.wire.client.CardClient``), so a
card actor in another process loads the extension by that name on first use; in-process cards read this
registry directly. The runtime itself
names no package here.
"""

from __future__ import annotations

import re
import threading

_PREFIX = re.compile(r"[a-z][a-z0-9]*\Z")
_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")
_lock = threading.Lock()
_declared: dict[str, str] = {}
version = 0          # bumped on every new declaration; clients compare it to what they announced


def declare(prefix: str, target: str) -> None:
    """Commands ``<prefix>_<name>`` are handled by ``target`` (``"package.module:Class"``) on every card."""
    global version
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise ValueError(f"card extension prefix {prefix!r} must be lowercase letters and digits")
    if not isinstance(target, str) or not _TARGET.match(target):
        raise ValueError(f"card extension target {target!r} must look like 'package.module:Class'")
    with _lock:
        if _declared.get(prefix) != target:
            _declared[prefix] = target
            version += 1


def declared() -> dict[str, str]:
    with _lock:
        return dict(_declared)


def valid(targets) -> dict[str, str]:
    """``targets`` if it is a well-formed {prefix: target} map (what a card accepts from a client)."""
    if not isinstance(targets, dict) or not all(
            isinstance(p, str) and _PREFIX.match(p) and isinstance(t, str) and _TARGET.match(t)
            for p, t in targets.items()):
        raise ValueError(f"not a map of card extension declarations: {targets!r}"[:200])
    return dict(targets)
