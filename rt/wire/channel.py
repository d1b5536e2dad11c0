"""The client ends of a command channel: in-process (tests, ``backend="local"``) and Unix-domain socket.

Both carry the messages of ``rt/wire/protocol.py`` and may carry file descriptors (SCM_RIGHTS), so
pinned host buffers and card segments are mapped, never copied through the channel. A transport has
``send(msg, fds=())`` and ``close()``; it hands every incoming message to the ``on_message(msg, fds)``
callback given at construction. The card's end of the socket is ``rt/wire/server.py``.

Every socket connection opens with a handshake: the client writes :data:`HELLO` and the 32-byte key of the
card set (``card.key`` beside the sockets, 0600, made with the set); the card compares it in constant time and
refuses a connection without the right key before reading anything else (docs/security.md). It costs one
40-byte write per connection and no round trip.
"""

from __future__ import annotations

import array
import hmac
import os
import secrets
import socket
import threading

from ..constants import AclErrorCode as E
from ..errors import AclError
from ..files import FileRefused, read_regular_file, write_private_file
from .protocol import MAX_FDS, pack, roundtrip, unpacker

RECV_BYTES = 1 << 20
KEY_FILE = "card.key"          # the card set's key, beside its sockets
KEY_BYTES = 32
HELLO = b"NPUSIMK1"            # the first bytes of every connection to a card, before the key
HANDSHAKE_BYTES = len(HELLO) + KEY_BYTES


def socket_path(socket_dir: str, node: int, index: int) -> str:
    """Where card ``index`` of ``node`` listens (the cards of one node share a directory, mode 0700)."""
    return os.path.join(socket_dir, f"npu{node}_{index}.sock")


def card_key(socket_dir: str, create: bool = False) -> bytes:
    """The key of the card set serving sockets in ``socket_dir`` (``create``: made now if the set has none
    yet — a set created in steps keeps its first key). AclError 207006 if it is missing or not private."""
    path = os.path.join(socket_dir, KEY_FILE)
    try:
        if create:
            write_private_file(path, secrets.token_bytes(KEY_BYTES))
        key = read_regular_file(path, KEY_BYTES, "card key", private=True)
    except FileRefused as e:
        raise AclError(E.ACL_ERROR_RT_NO_PERMISSION, f"{e.message} (a card admits only connections that present "
                                                     f"its job's key, kept in {path})") from None
    except OSError as e:
        raise AclError(E.ACL_ERROR_RT_NO_PERMISSION, f"card key: cannot create {path}: {e.strerror or e}") from None
    if len(key) != KEY_BYTES:
        raise AclError(E.ACL_ERROR_RT_NO_PERMISSION, f"card key: {path} holds {len(key)} bytes, expected {KEY_BYTES}")
    return key


def key_matches(frame: bytes, key: bytes) -> bool:
    """The handshake ``frame`` a client sent presents ``key`` (compared in constant time)."""
    return hmac.compare_digest(frame, HELLO + key)


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

    def __init__(self, path: str, on_message, on_close=None, timeout: float = 30.0, key: bytes | None = None):
        """``key``: the card set's key (default: read from ``card.key`` beside ``path``)."""
        self.path = path
        self._on_message = on_message
        self._on_close = on_close
        key = card_key(os.path.dirname(path)) if key is None else key
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.settimeout(timeout)
            self.sock.connect(path)
            self.sock.sendall(HELLO + key)          # fits the socket buffer: no wait for the card
            self.sock.settimeout(None)
        except BaseException:
            self.sock.close()
            raise
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
