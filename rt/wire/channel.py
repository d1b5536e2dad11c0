"""The client ends of a command channel: in-process (tests, ``backend="local"``) and Unix-domain socket.

Both carry the messages of ``rt/wire/protocol.py`` and may carry file descriptors (SCM_RIGHTS), so
pinned host buffers and card segments are mapped, never copied through the channel. A transport has
``send(msg, fds=())`` and ``close()``; it hands every incoming message to the ``on_message(msg, fds)``
callback given at construction. The card's end of the socket is ``rt/wire/server.py``.
"""

from __future__ import annotations

import array
import os
import socket
import threading

from .protocol import MAX_FDS, pack, roundtrip, unpacker

RECV_BYTES = 1 << 20


def socket_path(socket_dir: str, node: int, index: int) -> str:
    """Where card ``index`` of ``node`` listens (the cards of one node share a directory, mode 0700)."""
    return os.path.join(socket_dir, f"npu{node}_{index}.sock")
_FD_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)


def recv_chunk(sock: socket.socket):
    """One recvmsg: ``(bytes, fds)``; ``(None, [])`` at EOF."""
    data, anc, _flags, _addr = sock.recvmsg(RECV_BYTES, _FD_SPACE)
    if not data:
        return None, []
    fds = []
    for level, typ, payload in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[: len(payload) - (len(payload) % arr.itemsize)])
            fds.extend(arr)
    return data, fds


def recv_into(sock: socket.socket, unpacker):
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


def sendmsg(sock: socket.socket, lock: threading.Lock, msg, fds) -> None:
    data = pack(msg)
    with lock:
        if fds:
            sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        else:
            sock.sendall(data)


class LocalTransport:
    """Deliver messages straight to an in-process ``Card`` (no Ray, no sockets): for unit tests.

    Messages still go through msgpack, so anything that would not survive the real channel fails here.
    """

    def __init__(self, card, on_message, on_close=None):
        self.card = card
        self._on_message = on_message
        self._on_close = on_close
        self.conn = card.connect(self._deliver, pid=os.getpid(), label="local client")
        self.closed = False

    def _deliver(self, msg, fds=()):
        if not self.closed:
            self._on_message(roundtrip(msg), [os.dup(f) for f in fds])

    def send(self, msg, fds=()) -> None:
        if self.closed:
            raise BrokenPipeError("transport closed")
        self.card.handle(self.conn, roundtrip(msg), [os.dup(f) for f in fds])

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
        sendmsg(self.sock, self._lock, msg, fds)

    def _read(self) -> None:
        decoder = unpacker()
        fed = end = 0            # bytes fed to the decoder so far; end of the last complete message
        held: list[int] = []     # fds of a message whose bytes have not all arrived yet
        try:
            while True:
                data, fds = recv_chunk(self.sock)
                if data is None:
                    break
                decoder.feed(data)
                fed += len(data)
                msgs = []
                for m in decoder:
                    msgs.append(m)
                    end = decoder.tell()         # exact right after a complete message
                # Linux ends a recvmsg right after the piece of stream that carried descriptors, which is the
                # start of the message they were sent with: that message is the last one of this chunk, or, if
                # it is not complete yet (a large one), the next one to complete. Earlier held descriptors
                # belong to the first message completed here.
                carry, held = held, []
                last = []
                if fds:
                    if end < fed:
                        held = fds
                    else:
                        last = fds
                if not msgs:
                    held = carry + held
                    continue
                for i, m in enumerate(msgs):
                    mine = (carry if i == 0 else []) + (last if i == len(msgs) - 1 else [])
                    self._on_message(m, mine)
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
