"""A card's state per connection: one host context (a rank's process) or one peer card.

What a connection created lives here or is marked as its own (allocations, streams, events, models, extension
state), so the card releases all of it when the connection closes or its context is released
(``Card.disconnect``).
"""

from __future__ import annotations

import itertools
import threading

from ..errors import NpuError
from .queues import StreamQueue


class Connection:
    """Per-connection state on the card (one host context or one peer card)."""

    _ids = itertools.count(1)

    def __init__(self, send, pid: int = 0, label: str = "client"):
        self.id = next(self._ids)
        self.send = send                  # send(msg, fds=()) -> None
        self.pid = pid
        self.label = label
        self.host_buffers: dict[int, tuple] = {}        # buffer id -> (mmap, uint8 view)
        self.pending_fds: list[int] = []  # fds received ahead of the message that claims them
        self.default_stream: StreamQueue | None = None
        self.callbacks: dict[int, threading.Event] = {}
        self.callback_failures: dict[int, list] = {}     # cb_id -> an NpuError on the wire, for run() to raise
        self.state_page = None            # Segment: [host_done, errors] per shared stream (c_stream_share)
        self.state_slots = 0
        self.state_free: list[int] = []   # slots of destroyed streams, for reuse
        self.orphan_errors: list[NpuError] = []   # tasks for streams that no longer exist (see Card._task)
        self.draining: set[StreamQueue] = set()        # destroyed streams still running what they held
        self.bad_messages = 0
        self.trace = (0, False)           # (task-log length per stream or 0 for the default, sample memory?)
        self.closed = False

    def __repr__(self) -> str:
        return f"{self.label} {self.id} (pid {self.pid})"
