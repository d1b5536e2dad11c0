"""The seam through which packages extend every card: the card is extended, not edited.

An extension is a class with the card's own calling convention, instantiated once per card on the first
command that names it (its per-card state lives on the instance). Its ``__init__`` writes out two tables,
keyed by the full wire name ``<prefix>_<name>``, as the card's parts do:

- ``commands``: ``"<prefix>_<name>": handler`` with ``handler(conn, *args)`` answering the command (return a
  value, ``with_fds(...)``, or ``DEFERRED`` and reply later through ``card.reply_later``);
- ``tasks``: ``"<prefix>_<name>": prepare`` with ``prepare(conn, stream, *args)`` preparing the task in
  program order and returning the closure the stream runs;

and it may override ``release_owner(conn)`` (a connection closes or its context is released) and ``close()``
(the card shuts down).

Which class serves a prefix is declared by name (``rt/wire/extensions.py``); the card imports it on first
use. It reaches the card through the card's public parts: ``memory``, ``peers``, ``config``, ``fabric``,
``where``, ``reply_later``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from ..constants import AclErrorCode as E
from ..errors import AclError


class Extension:
    """Base of a package's per-card part (see the module docstring)."""

    def __init__(self, card):
        self.card = card
        self.commands: dict[str, Callable] = {}     # "<prefix>_<name>" -> handler(conn, *args)
        self.tasks: dict[str, Callable] = {}        # "<prefix>_<name>" -> prepare(conn, stream, *args)

    def release_owner(self, conn) -> None:
        """Everything ``conn`` created through this extension goes (its process reset the device or died)."""

    def close(self) -> None:
        """The card shuts down."""


def load(prefix: str, target: str) -> type[Extension]:
    """The Extension class ``target`` (``"module:Class"``) names, imported now."""
    module, _, name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise AclError(E.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                       f"card extension {prefix!r} ({target}) cannot be loaded on this card: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, Extension)):
        raise AclError(E.ACL_ERROR_RT_FEATURE_NOT_SUPPORT, f"card extension {prefix!r}: {target} is not an Extension")
    return cls


def create(prefix: str, target: str, card) -> Extension:
    """``card``'s instance of the extension ``target`` declared for ``prefix``, its tables checked: every
    name in them must start with ``<prefix>_`` (a name it does not own would never reach it)."""
    ext = load(prefix, target)(card)
    stray = sorted(n for n in (*ext.commands, *ext.tasks) if not n.startswith(prefix + "_"))
    if stray:
        raise AclError(E.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                       f"card extension {prefix!r} ({target}) names commands outside its prefix: {stray}")
    return ext
