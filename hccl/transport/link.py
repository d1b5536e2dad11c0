"""Direct links between card processes: what crosses nodes without a broker in the middle.

Every card process that joins a communicator spanning nodes listens on one TCP socket (its node's address
as Ray knows it: 127.0.0.1 for simulated nodes on this machine) and publishes ``[host, port, token]`` in the
communicator's rendezvous. A message is a frame — ``(comm_id, key)``, a small msgpack header and raw payload
bytes — sent over a connection opened once per (sender process, receiver process) and kept; the receiver's
reader thread files it in the process's :class:`Mailbox` under ``(comm_id, key)``, where exactly the one
thread waiting for that key is woken (an event per key: a message never wakes the other waiters).

A connection must present the receiver's token (16 random bytes, known only through the rendezvous, which
runs over Ray's authenticated channel) before anything it sends is read; anything else is dropped.
"""

from __future__ import annotations

import hmac
import secrets
import socket
import struct
import threading

import msgpack

_HEAD = struct.Struct("!IQ")          # header bytes, payload bytes
TOKEN_BYTES = 16
TOKEN_WAIT = 10.0                    # seconds a new connection has to present the token
MAX_HEADER = 16 << 20


class LinkClosed(Exception):
    """The frame could not be sent: the receiving process is gone or refused it."""


class Mailbox:
    """Frames of this process by (comm_id, key): ``put`` by readers, ``take`` by the one thread expecting it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._slots: dict[tuple, list] = {}      # key -> [event, header, payload]

    def put(self, key: tuple, header, payload) -> None:
        with self._lock:                       # filled under the lock: a ``take`` giving up pops it in one step
            slot = self._slots.setdefault(key, [threading.Event(), None, None])
            slot[1], slot[2] = header, payload
            slot[0].set()

    def peek(self, key: tuple):
        """(header, payload) of frame ``key`` if it is here, left in place; else None."""
        with self._lock:
            slot = self._slots.get(key)
        return (slot[1], slot[2]) if slot is not None and slot[0].is_set() else None

    def take(self, key: tuple, timeout: float):
        """(header, payload) of frame ``key``, or None after ``timeout`` seconds."""
        with self._lock:
            slot = self._slots.setdefault(key, [threading.Event(), None, None])
        got = slot[0].wait(timeout)
        with self._lock:
            self._slots.pop(key, None)     # a frame arriving after a timeout starts a new slot nobody takes
            if got or slot[0].is_set():
                return slot[1], slot[2]
        return None


class LinkServer:
    """This process's listening end and its outgoing connections (one instance per process: ``server()``)."""

    def __init__(self, host: str):
        self.mailbox = Mailbox()
        self._sock, self.token, self.address = listen(host)
        self._out: dict[tuple, tuple[socket.socket, threading.Lock]] = {}
        self._out_lock = threading.Lock()
        serve(self._sock, self._read, "hccl-link")

    # -- receiving ----------------------------------------------------------------------------------
    def _read(self, conn: socket.socket) -> None:
        try:
            if not admit(conn, self.token):
                return
            while True:                      # frames come whenever a collective sends one
                (comm_id, key, header), payload = read_frame(conn)
                self.mailbox.put((comm_id, *key), header, payload)
        except (OSError, EOFError, ValueError, MemoryError, msgpack.UnpackException):
            return
        finally:
            conn.close()

    # -- sending ------------------------------------------------------------------------------------
    def send(self, address, comm_id: str, key: tuple, header=None, payload=b"") -> None:
        """Frame ``(comm_id, key)`` to the process listening at ``address`` ([host, port, token]); raises
        LinkClosed if it cannot be delivered."""
        if list(address) == self.address:
            self.mailbox.put((comm_id, *key), header, bytes(payload))
            return
        view = memoryview(payload).cast("B") if not isinstance(payload, bytes) else payload
        frame = frame_head([comm_id, list(key), header], len(view))
        sock, lock = self._connection(address)
        try:
            with lock:
                sock.sendall(frame)
                if len(view):
                    sock.sendall(view)
        except OSError as e:
            with self._out_lock:
                self._out.pop(tuple(address[:2]), None)
            sock.close()
            raise LinkClosed(f"{address[0]}:{address[1]}: {e}") from None

    def _connection(self, address):
        where = (address[0], int(address[1]))
        with self._out_lock:
            got = self._out.get(where)
            if got is not None:
                return got
        try:
            sock = connect(address)
        except OSError as e:
            raise LinkClosed(f"{where[0]}:{where[1]}: {e}") from None
        with self._out_lock:
            if where in self._out:             # another thread connected meanwhile: keep one
                sock.close()
                return self._out[where]
            self._out[where] = (sock, threading.Lock())
            return self._out[where]


# -- what both ends of a direct connection do (also the node leaders' connections: ``leaders.py``) ---------
def listen(host: str) -> tuple[socket.socket, bytes, list]:
    """A listening socket on ``host``, a fresh token, and the address others connect to: [host, port, token]."""
    token = secrets.token_bytes(TOKEN_BYTES)
    sock = socket.create_server((host, 0), backlog=512)
    return sock, token, [host, sock.getsockname()[1], token.hex()]


def serve(sock: socket.socket, handle, name: str) -> None:
    """Accept connections on ``sock`` in a thread, each handled by ``handle(conn)`` in a thread of its own."""
    def accept() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), name=f"{name}-read", daemon=True).start()
    threading.Thread(target=accept, name=f"{name}-accept", daemon=True).start()


def admit(conn: socket.socket, token: bytes) -> bool:
    """Whether an accepted connection presents ``token`` within TOKEN_WAIT (a client that connects and says
    nothing does not hold a thread forever); it then blocks for as long as frames take to come."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.settimeout(TOKEN_WAIT)
    if not hmac.compare_digest(_recv_exact(conn, TOKEN_BYTES), token):
        return False
    conn.settimeout(None)
    return True


def connect(address) -> socket.socket:
    """A connection to the process listening at ``address`` ([host, port, token]), its token presented. Raises
    OSError."""
    sock = socket.create_connection((address[0], int(address[1])), timeout=10)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(bytes.fromhex(address[2]))
    return sock


def frame_head(header, payload_bytes: int) -> bytes:
    """The bytes of a frame before its payload: the two lengths, then ``header`` in msgpack."""
    head = msgpack.packb(header)
    return _HEAD.pack(len(head), payload_bytes) + head


def read_frame(conn: socket.socket):
    """One frame: (header, payload). Raises OSError, EOFError, ValueError or msgpack's errors."""
    hlen, plen = _HEAD.unpack(_recv_exact(conn, _HEAD.size))
    if hlen > MAX_HEADER:
        raise ValueError(f"a frame header of {hlen} bytes (at most {MAX_HEADER})")
    header = msgpack.unpackb(_recv_exact(conn, hlen), use_list=True)
    return header, bytes(_recv_exact(conn, plen)) if plen else b""


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = conn.recv_into(view[got:])
        if not k:
            raise EOFError
        got += k
    return buf


_server: LinkServer | None = None
_server_lock = threading.Lock()


def server(host: str) -> LinkServer:
    """This process's link server (started by the first communicator that needs it)."""
    global _server
    with _server_lock:
        if _server is None:
            _server = LinkServer(host)
        return _server
