"""What a card's command handlers may return besides a plain value (``Card.handle`` sends the reply)."""

from __future__ import annotations

DEFERRED = object()          # the handler replies later, through Card.reply_later (e.g. a synchronize marker)


class WithFds:
    """A reply that carries file descriptors (SCM_RIGHTS): ``value`` plus ``fds``; ``close``: the fds were
    opened just for this reply and are closed once it is sent."""

    __slots__ = ("value", "fds", "close")

    def __init__(self, value, fds, close: bool = False):
        self.value, self.fds, self.close = value, list(fds), close


def with_fds(value, fds, close: bool = False) -> WithFds:
    return WithFds(value, fds, close)
