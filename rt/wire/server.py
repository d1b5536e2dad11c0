"""The card's end of the Unix-socket channel: one listening socket per card, a reader thread per connection.

Every connected process (a host context, or a peer card) becomes a ``Connection`` of the card; what it
sends goes to ``Card.handle``, which never raises. A connection that sends bytes that are not our protocol
ends quietly. Socket files are mode 0600 in a 0700 directory: nothing of ours listens on a network
interface.
"""

from __future__ import annotations

import os
import socket
import threading

from .channel import recv_into, sendmsg
from .protocol import unpacker


class CardServer:
    """The card's listening Unix socket: one reader thread per connected process (or peer card)."""

    def __init__(self, card, path: str, make_dir: bool = True):
        """``make_dir=False``: the directory must exist (a card actor booting after its set was destroyed must
        fail, not recreate the directory its owner already removed)."""
        self.card = card
        self.path = path
        if make_dir:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.sock.bind(path)
        finally:
            os.umask(old)
        self.sock.listen(128)
        self.closed = False
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, name="npu-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                s, _ = self.sock.accept()
            except OSError:
                return
            self._conns.append(s)
            threading.Thread(target=self._serve, args=(s,), name="npu-conn", daemon=True).start()

    def _serve(self, s: socket.socket) -> None:
        lock = threading.Lock()

        def send(msg, fds=()):
            try:
                sendmsg(s, lock, msg, fds)
            except OSError:
                pass  # the process went away; disconnect() follows from the reader

        try:
            pid = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            pid = int.from_bytes(pid[:4], "little")
        except OSError:
            pid = 0
        conn = self.card.connect(send, pid=pid)
        decoder = unpacker()
        try:
            while True:
                msgs, fds = recv_into(s, decoder)
                if fds is None:
                    break
                conn.pending_fds.extend(fds)
                for m in msgs:
                    self.card.handle(conn, m)
        except Exception:
            # The process went away (OSError) or sent bytes that are not our protocol (msgpack errors):
            # either way this connection ends here, quietly; Card.handle itself never raises.
            pass
        finally:
            self.card.disconnect(conn)
            s.close()
            if s in self._conns:
                self._conns.remove(s)

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        finally:
            for s in list(self._conns):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            if os.path.exists(self.path):
                os.unlink(self.path)
