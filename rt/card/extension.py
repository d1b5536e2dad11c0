"""The seam through which packages extend every card: the card is extended, not edited.

An extension is a class with the card's own calling convention, instantiated once per card on the first
command that names it (its per-card state lives on the instance):

- ``c_<name>(self, conn, *args)`` answers command ``<prefix>_<name>`` (return a value, ``with_fds(...)``,
  or ``DEFERRED`` and reply later through ``card.reply_later``);
- ``t_<name>(self, conn, stream, *args)`` prepares task ``<prefix>_<name>`` in program order and returns
  the closure the stream runs;
- ``release_owner(conn)`` when a connection closes or its context is released, ``close()`` when the card
  shuts down.

Which class serves a prefix is declared by name (``rt/wire/extensions.py``); the card imports it on first
use. It reaches the card through the card's public parts: ``memory``, ``peers``, ``config``, ``fabric``,
``where``, ``reply_later``.
"""

from __future__ import annotations

import importlib

from ..constants import AclErrorCode as E
from ..errors import AclError


class Extension:
    """Base of a package's per-card part (see the module docstring)."""

    prefix = ""

    def __init__(self, card):
        self.card = card

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
