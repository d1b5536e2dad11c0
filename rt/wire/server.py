"""The card's end of the Unix-socket channel: one listening socket per card, a reader thread per connection.

Every connected process (a host context, or a peer card) becomes a ``Connection`` of the card; what it
sends goes to ``Card.handle``, which never raises. A connection that sends bytes that are not our protocol
ends quietly. Socket files are mode 0600 in a 0700 directory: nothing of ours listens on a network
interface. A connection must first present the card set's key (``rt/wire/channel.py``): one that presents
another is told so and closed, before the card sees it (the first such refusal of a card is logged).
"""

from __future__ import annotations

import os
import socket
import threading

from ..diag import slog
from ..files import setup_dir
from ..constants import AclErrorCode as E
from .channel import HANDSHAKE_BYTES, HELLO, card_key, key_matches, recv_into, sendmsg
from .protocol import NOTIFY, unpacker

HANDSHAKE_TIMEOUT = 10.0     # seconds a new connection has to present its key


class CardServer:
    """The card's listening Unix socket: one reader thread per connected process (or peer card)."""

    def __init__(self, card, path: str, make_dir: bool = True, key: bytes | None = None):
        """``make_dir=False``: the directory must exist (a card actor booting after its set was destroyed must
        fail, not recreate the directory its owner already removed). ``key``: the set's key (default: the
        directory's ``card.key``, made if it has none)."""
        self.card = card
        self.path = path
        directory = os.path.dirname(path) or "."
        setup_dir(directory, "card socket directory", create=make_dir)
        self.key = card_key(directory, create=True) if key is None else key
        self.refused = 0                  # connections refused for a wrong or missing key
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
        self._acceptor = threading.Thread(target=self._accept, name="npu-accept", daemon=True)
        self._acceptor.start()

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
        if not self._admit(s, pid, send):
            self._drop(s)
            return
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
            self._drop(s)

    def _admit(self, s: socket.socket, pid: int, send) -> bool:
        """Read the connection's handshake; False (the peer told why, unless it left) without the set's key."""
        frame = b""
        try:
            s.settimeout(HANDSHAKE_TIMEOUT)
            while len(frame) < HANDSHAKE_BYTES:
                chunk = s.recv(HANDSHAKE_BYTES - len(frame))
                if not chunk:
                    return False          # a probe (npu-smi's liveness check) or a client that gave up
                frame += chunk
                if frame[:len(HELLO)] != HELLO[:len(frame)]:
                    break                 # not our handshake at all (an old client, garbage): refuse at once
            s.settimeout(None)
        except OSError:
            return False
        if key_matches(frame, self.key):
            return True
        self.refused += 1
        where = f"card {self.card.index} (node {self.card.node})"
        text = (f"{where} refused the connection of pid {pid}: it did not present the key of the job owning the "
                f"card (a process of another job, or one that read a key other than {os.path.dirname(self.path)}"
                f"/card.key)")
        if self.refused == 1:             # once per card: a client retrying in a loop must not flood the log
            slog.error(slog.RUNTIME, "%s; further refusals on this card are not logged", text)
        send([NOTIFY, "refused", [int(E.ACL_ERROR_RT_NO_PERMISSION), text]])
        return False

    def _drop(self, s: socket.socket) -> None:
        s.close()
        if s in self._conns:
            self._conns.remove(s)

    def close(self) -> None:
        self.closed = True
        try:
            # close() alone leaves a thread blocked in accept() for good (Linux does not wake it), so a warm
            # card's reset leaked one thread per job; shutdown() of a listening socket wakes accept with EINVAL.
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
            if self._acceptor is not threading.current_thread():
                self._acceptor.join(timeout=5)
                if self._acceptor.is_alive():
                    slog.warning(slog.RUNTIME, "card %d (node %d): the accept thread of %s still runs 5 s after "
                                 "close", self.card.index, self.card.node, self.path)
        finally:
            for s in list(self._conns):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            if os.path.exists(self.path):
                os.unlink(self.path)
