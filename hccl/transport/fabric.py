"""Which transport a card uses: the one of its ``fabric`` (``hccl/transport/base.py`` says what they do)."""

from __future__ import annotations

from .local import InProcessTransport


def for_card(card):
    """The transport of ``card``'s fabric (created once per card)."""
    if card.fabric == "ray":
        from .ray import RayTransport  # imports Ray: card actors only
        return RayTransport(card.scope)
    return InProcessTransport()
