"""The messages between a host process and a card (and between cards): msgpack lists, fds alongside.

- ``[CALL, req_id, name, args]``: run command ``name`` on the card and reply ``[req_id, ok, value]``; a
  failed command replies ``ok = False`` with ``value = [kind, code, message]`` (``rt.errors.to_wire``).
  Some replies come later (a stream synchronize answers when the stream gets there).
- ``[TASK, stream_id, name, args]``: enqueue task ``name`` on a stream of the card; never answered — its
  failure surfaces at the next synchronize that covers it.
- ``[NOTIFY, kind, payload]`` (card → host): a stream reached a notify point, a host callback is due, a
  task raised a warning.

Command and task names are keys of the card's command and task tables (``rt/card/card.py``): the card's own
(``malloc``, ``memcpy``, ``stream_sync``, ...) or ``<prefix>_<name>`` for a package that extends the card
(``hccl_init``: ``rt/card/extension.py``). File descriptors (SCM_RIGHTS) travel with a message to map memory,
never to copy it.
"""

from __future__ import annotations

import msgpack

CALL, TASK = 0, 1
NOTIFY = 0            # the first element of a card → host notification (no request id is 0)
MAX_FDS = 16          # descriptors one message may carry


def pack(msg) -> bytes:
    return msgpack.packb(msg, use_bin_type=True)


def unpacker() -> msgpack.Unpacker:
    """A streaming decoder for one connection's bytes."""
    return msgpack.Unpacker(raw=False, max_buffer_size=1 << 31)


def roundtrip(msg):
    """``msg`` as the other end would decode it (in-process transports: what would not survive the real
    channel fails here too)."""
    return msgpack.unpackb(pack(msg), raw=False)
