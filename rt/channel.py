"""Command channels between a process and a card: in-process (tests) and Unix-domain socket.

Both carry the same msgpack messages (see ``rt/card.py``) and may carry file descriptors
(SCM_RIGHTS) so pinned host buffers and card segments are mapped, never copied through the channel.
A transport has ``send(msg, fds=())`` and ``close()``; it hands every incoming message to the
``on_message(msg, fds)`` callback given at construction. Socket files are mode 0600 in a 0700
directory: nothing of ours listens on a network interface.
"""

from __future__ import annotations

import array
import os
import socket
import threading

import msgpack

MAX_FDS = 16
RECV_BYTES = 1 << 20
_FD_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)


def _pack(msg) -> bytes:
    return msgpack.packb(msg, use_bin_type=True)


def _recv_into(sock: socket.socket, unpacker: msgpack.Unpacker):
    """One recvmsg: feed the bytes, return (messages, fds); ([], None) at EOF."""
    data, anc, _flags, _addr = sock.recvmsg(RECV_BYTES, _FD_SPACE)
    if not data:
        return [], None
    fds = []
    for level, typ, payload in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[: len(payload) - (len(payload) % arr.itemsize)])
            fds.extend(arr)
    unpacker.feed(data)
    return list(unpacker), fds


def _sendmsg(sock: socket.socket, lock: threading.Lock, msg, fds) -> None:
    data = _pack(msg)
    with lock:
        if fds:
            sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        else:
            sock.sendall(data)


class LocalTransport:
    """Deliver messages straight to an in-process ``Card`` (no Ray, no sockets): for unit tests.

    Messages still go through msgpack so anything that would not survive the real channel fails here.
    """

    def __init__(self, card, on_message, on_close=None):
        self.card = card
        self._on_message = on_message
        self._on_close = on_close
        self.conn = card.connect(self._deliver, pid=os.getpid(), label="local client")
        self.closed = False

    def _deliver(self, msg, fds=()):
        if not self.closed:
            self._on_message(msgpack.unpackb(_pack(msg), raw=False), [os.dup(f) for f in fds])

    def send(self, msg, fds=()) -> None:
        if self.closed:
            raise BrokenPipeError("transport closed")
        self.card.handle(self.conn, msgpack.unpackb(_pack(msg), raw=False), [os.dup(f) for f in fds])

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.card.disconnect(self.conn)


class SocketTransport:
    """Client end of a card's Unix socket; a daemon thread reads replies and notifications."""

    def __init__(self, path: str, on_message, on_close=None, timeout: float = 30.0):
        self.path = path
        self._on_message = on_message
        self._on_close = on_close
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.sock.settimeout(None)
        self._lock = threading.Lock()
        self.closed = False
        self._reader = threading.Thread(target=self._read, name=f"npu-chan-{os.path.basename(path)}", daemon=True)
        self._reader.start()

    def send(self, msg, fds=()) -> None:
        if self.closed:
            raise BrokenPipeError(f"channel to {self.path} is closed")
        _sendmsg(self.sock, self._lock, msg, fds)

    def _read(self) -> None:
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=1 << 31)
        try:
            while True:
                msgs, fds = _recv_into(self.sock, unpacker)
                if fds is None:
                    break
                for i, m in enumerate(msgs):
                    self._on_message(m, fds if i == 0 else [])
        except OSError:
            pass
        finally:
            self.closed = True
            if self._on_close:
                self._on_close()

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class CardServer:
    """The card's listening Unix socket: one reader thread per connected process (or peer card)."""

    def __init__(self, card, path: str):
        self.card = card
        self.path = path
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
                _sendmsg(s, lock, msg, fds)
            except OSError:
                pass  # the process went away; disconnect() follows from the reader

        try:
            pid = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            pid = int.from_bytes(pid[:4], "little")
        except OSError:
            pid = 0
        conn = self.card.connect(send, pid=pid)
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=1 << 31)
        try:
            while True:
                msgs, fds = _recv_into(s, unpacker)
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
