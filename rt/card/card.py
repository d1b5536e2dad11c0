"""A simulated card as a plain Python object: memory, streams, events, kernels, models — and extensions.

The card serves *connections* (one per host context, or per peer card: ``connection.py``). A transport
(in-process, Unix socket) opens one with :meth:`Card.connect` ``(send, pid, label)``, ``send(msg, fds=())``
being how the card answers, and delivers decoded messages (``rt/wire/protocol.py``) to :meth:`Card.handle`,
which never raises:

- a command ``[CALL, req, name, args]`` runs the handler its name maps to in a command table,
  ``handler(conn, *args)``, and its value is the reply (handlers may reply later by returning ``DEFERRED``,
  or send fds with ``with_fds``);
- a task ``[TASK, stream, name, args]`` runs the preparer its name maps to in a task table,
  ``prepare(conn, stream, *args)``, at once (in program order: it validates and resolves), and the closure
  it returns runs when the stream gets there.

The card is composed of parts, each with its tables written out by name: its own commands (below), memory
(``memcmds.py``), streams and events (``streamcmds.py``), kernels and models (``execcmds.py``); the card
merges their tables once, when it is made. A name ``<prefix>_<rest>`` that none of them has goes to the
tables of the extension declared for ``<prefix>`` (``rt/card/extension.py``). Everything a connection
created (allocations, streams, events, models, mapped host buffers, extension state) is released when it
closes.
"""

from __future__ import annotations

import collections
import itertools
import os
import threading

import numpy as np

from .. import errors
from ..addresses import decode_addr
from ..constants import AclErrorCode as E
from ..dtypes import np_dtype
from ..errors import AclError, NpuError
from ..wire import extensions
from ..wire.protocol import CALL, TASK
from . import extension
from .connection import Connection
from .dispatch import DEFERRED, WithFds
from .execcmds import ExecCommands
from .memcmds import MemoryCommands, close_map
from .memory import DeviceMemory
from .models import ModelStore
from .queues import CardEvent, StreamQueue, Task, forward_warnings
from .streamcmds import StreamCommands


MONITOR_LABEL = "npu-smi"          # the label of monitoring connections (c_usage leaves them out)


class Card:
    """One simulated NPU. Thread-safe; driven by :meth:`handle` from any number of transports.

    The shell that hosts it sets ``peers`` (how to reach the other cards of the node), ``config`` (the
    simulated hardware) and ``fabric`` (``"local"``: every card in this process; ``"ray"``: card actors,
    named in the Ray namespace ``scope``).
    """

    def __init__(self, *, node: int = 0, index: int = 0, capacity: int = 2 << 30, soc_name: str = "Ascend910B1",
                 small_segment: int = 2 << 20, large_segment: int = 20 << 20, cards_per_node: int = 8,
                 va_start: int | None = None):
        forward_warnings()
        self.node, self.index = node, index
        self.where = f"card {index} (node {node})"
        self.soc_name = soc_name
        self.cards_per_node = cards_per_node
        self.memory = DeviceMemory(node=node, card=index, capacity=capacity, small_segment=small_segment,
                                   large_segment=large_segment, **({} if va_start is None else {"va_start": va_start}))
        self.streams: dict[int, StreamQueue] = {}
        self.events: dict[int, CardEvent] = {}
        self.conns: dict[int, Connection] = {}
        self.models = ModelStore(self.memory)
        self.peers = None                 # set by the shell: other cards' memory and events
        self.config = None
        self.fabric = "local"
        self.scope = None                 # with fabric "ray": the job's Ray namespace
        self._extensions: dict[str, extension.Extension] = {}
        self._targets: dict[str, str] = {}   # extension declarations received from clients
        self._ids = itertools.count(1)
        self.lock = threading.Lock()         # guards conns, streams, events and the extensions
        self.memcmds = MemoryCommands(self)
        self.streamcmds = StreamCommands(self)
        self.execcmds = ExecCommands(self)
        own = {
            "hello": self.c_hello,
            "ping": self.c_ping,
            "usage": self.c_usage,
            "release": self.c_release,
            "extensions": self.c_extensions,
        }
        parts = (self.memcmds, self.streamcmds, self.execcmds)
        self.commands = _merge(own, *(p.commands for p in parts))      # wire name -> handler(conn, *args)
        self.tasks = _merge(*(p.tasks for p in parts))                 # wire name -> prepare(conn, stream, *args)

    # ---------------------------------------------------------------- extensions
    def extension(self, prefix: str) -> extension.Extension:
        """The card's instance of the extension declared for ``prefix`` (created on first use)."""
        ext = self._extensions.get(prefix)
        if ext is not None:
            return ext
        with self.lock:
            ext = self._extensions.get(prefix)
            if ext is None:
                target = self._targets.get(prefix) or extensions.declared().get(prefix)
                if target is None:
                    raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"no card extension {prefix!r} is declared on "
                                                                 f"{self.where}")
                ext = self._extensions[prefix] = extension.create(prefix, target, self)
        return ext

    def _extension_handler(self, name: str, task: bool):
        """The entry for ``name`` (``<prefix>_<rest>``) in the task or command table of the extension declared
        for ``<prefix>`` (loaded now if need be); None when no extension is declared for it or it has no such
        entry."""
        prefix, sep, _ = name.partition("_")
        ext = self._extensions.get(prefix)
        if ext is None:
            if not sep or (prefix not in self._targets and prefix not in extensions.declared()):
                return None
            ext = self.extension(prefix)
        return (ext.tasks if task else ext.commands).get(name)

    def c_extensions(self, conn, targets):
        """A client declares the extensions its process uses (``rt/wire/extensions.py``)."""
        self._targets.update(extensions.valid(targets))

    # ---------------------------------------------------------------- connections
    def connect(self, send, pid: int = 0, label: str = "client") -> Connection:
        conn = Connection(send, pid, label)
        with self.lock:
            self.conns[conn.id] = conn
        return conn

    def disconnect(self, conn: Connection) -> None:
        """Release everything ``conn`` created (its process reset the device, exited or died)."""
        if conn.closed:
            return
        conn.closed = True
        for ev in conn.callbacks.values():
            ev.set()
        with self.lock:
            self.conns.pop(conn.id, None)
            mine = [s for s in self.streams.values() if s.owner is conn]
            for s in mine:
                del self.streams[s.id]
            for eid in [e.id for e in self.events.values() if e.owner is conn]:
                del self.events[eid]
        for s in mine + list(conn.draining):
            s.close(drain=False)
        try:
            self.models.release_owner(conn.id)
        except NpuError:
            pass
        for ext in list(self._extensions.values()):
            ext.release_owner(conn)
        self.memory.free_owner(conn.id)
        for mm, _ in conn.host_buffers.values():
            close_map(mm)
        conn.host_buffers.clear()
        for fd in conn.pending_fds:
            os.close(fd)
        if conn.state_page is not None:
            for s in mine:
                s.state = None
            conn.state_page.close()
            conn.state_page = None

    def close(self) -> None:
        for conn in list(self.conns.values()):
            self.disconnect(conn)
        for ext in list(self._extensions.values()):
            ext.close()
        self.memory.close()

    # ---------------------------------------------------------------- dispatch
    def handle(self, conn: Connection, msg, fds=()) -> None:
        """Process one message from ``conn``; never raises. A bad command fails that command (its reply, or
        the next synchronize covering a task); a message that is not a command at all is dropped."""
        conn.pending_fds.extend(fds)
        if not (isinstance(msg, list) and len(msg) == 4 and msg[0] in (CALL, TASK) and type(msg[1]) is int
                and isinstance(msg[2], str) and isinstance(msg[3], list)):
            conn.bad_messages += 1          # not from our client (garbage on the socket): nobody to answer
            return
        kind, tag, name, args = msg
        if kind == TASK:
            self._task(conn, tag, name, args)
            return
        try:
            fn = self.commands.get(name) or self._extension_handler(name, False)
            if fn is None:
                raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"unknown card command {name!r}")
            result = fn(conn, *args)
        except NpuError as e:
            # Not recorded here: the host's client records it for get_recent_err_msg(); recording on
            # the card would duplicate it (in-process cards) or grow the reader thread's text forever.
            conn.send([tag, False, errors.to_wire(e)])
            return
        except Exception as e:  # bad arguments from a client must never crash the card
            conn.send([tag, False, errors.to_wire(AclError(E.ACL_ERROR_RT_PARAM_INVALID,
                                                             f"{name}: bad request: {type(e).__name__}: {e}"))])
            return
        if result is DEFERRED:
            return
        if isinstance(result, WithFds):
            try:
                self._reply(conn, tag, name, result.value, result.fds)
            finally:
                if result.close:                                  # fds obtained just for this reply
                    for fd in result.fds:
                        os.close(fd)
            return
        self._reply(conn, tag, name, result)

    @staticmethod
    def _reply(conn: Connection, tag: int, name: str, value, fds=()) -> None:
        """Send a command's result; one the wire cannot encode (an integer past 64 bits, say) fails that
        command with 507000 instead of ending the connection (the server's reader would take the encoder's
        exception for a broken peer)."""
        try:
            conn.send([tag, True, value], fds)
        except (TypeError, ValueError, OverflowError) as e:
            conn.send([tag, False, errors.to_wire(AclError(E.ACL_ERROR_RT_INTERNAL_ERROR,
                                                             f"{name}: the card's reply cannot be encoded: {e}"))])

    def _task(self, conn: Connection, sid: int, name: str, args) -> None:
        try:
            stream = self.stream(conn, sid)
        except NpuError as e:
            # No such stream (destroyed while another host thread enqueued on it): the task cannot run
            # anywhere in order, so its error waits for the context's next synchronize_device.
            conn.orphan_errors.append(type(e)(e.code, f"task {name} on stream {sid}: {e.message}"))
            return
        label = f"{name}#{stream.enqueued + 1}"
        try:
            prep = self.tasks.get(name) or self._extension_handler(name, True)
            if prep is None:
                raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"unknown card task {name!r}")
            fn = prep(conn, stream, *args)
        except NpuError as e:
            fn = _raiser(e)
        except Exception as e:
            fn = _raiser(AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{name}: bad request: {type(e).__name__}: {e}"))
        try:
            stream.push(Task(label, fn, host=True))
        except NpuError as e:             # the stream closed between the lookup and the push
            conn.orphan_errors.append(type(e)(e.code, f"task {label}: {e.message}"))

    def reply_later(self, conn: Connection, req: int, error: NpuError | None = None, value=None) -> None:
        if conn.closed:
            return
        if error is not None:
            conn.send([req, False, errors.to_wire(error)])
        else:
            self._reply(conn, req, "deferred reply", value)

    # ---------------------------------------------------------------- lookups (for the parts and extensions)
    def new_id(self) -> int:
        """A fresh stream or event id of this card."""
        return next(self._ids)

    def stream(self, conn: Connection, sid: int) -> StreamQueue:
        """``conn``'s stream ``sid`` (0: its default stream, made on first use)."""
        if sid == 0:
            if conn.default_stream is None:
                conn.default_stream = self.new_stream(conn)
            return conn.default_stream
        s = self.streams.get(sid)
        if s is None:
            raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE, f"stream {sid} does not exist on {self.where} (destroyed?)")
        if s.owner is not conn:
            raise AclError(E.ACL_ERROR_RT_STREAM_CONTEXT,
                           f"stream {sid} belongs to another context ({s.owner}), not {conn}")
        return s

    def new_stream(self, conn: Connection) -> StreamQueue:
        s = StreamQueue(self.new_id(), conn, self.where)
        self.trace_stream(conn, s)
        with self.lock:
            self.streams[s.id] = s
        return s

    def trace_stream(self, conn: Connection, s: StreamQueue) -> None:
        """Give stream ``s`` the task log ``conn`` asked for (``trace_config``)."""
        length, memory = conn.trace
        if length and s.log.maxlen != length:
            s.log = collections.deque(s.log, maxlen=length)
        s.sampler = (lambda: self.memory.capacity - self.memory.mem_info()[0]) if memory else None

    def device_view(self, ptr: int, nbytes: int, what: str) -> np.ndarray:
        """A checked uint8 view of device memory on this card or, through ``peers``, another card."""
        where = decode_addr(ptr) if isinstance(ptr, int) else None
        if where is not None and where != (self.node, self.index) and self.peers is not None:
            return self.peers.view(where, ptr, nbytes, what)
        return self.memory.view(ptr, nbytes, what=what)

    def region(self, conn: Connection, desc, nbytes: int, what: str) -> np.ndarray:
        """A checked uint8 view of a copy's side: ``["dev", ptr]``, ``["pin", buffer id, offset]`` (a host buffer
        of ``conn``) or ``["inline", bytes]``."""
        kind = desc[0]
        if kind == "dev":
            return self.device_view(desc[1], nbytes, what)
        if kind == "pin":
            _, buf_id, offset = desc
            entry = conn.host_buffers.get(buf_id)
            if entry is None:
                raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{what}: host buffer {buf_id:#x} is not registered")
            arr = entry[1]
            if offset < 0 or offset + nbytes > arr.nbytes:
                raise AclError(E.ACL_ERROR_RT_PARAM_INVALID,
                               f"{what}: [{offset}, {offset + nbytes}) exceeds host buffer of {arr.nbytes} bytes")
            return arr[offset:offset + nbytes]
        if kind == "inline":
            data = desc[1]
            if len(data) < nbytes:
                raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{what}: {len(data)} bytes given, {nbytes} needed")
            return np.frombuffer(data, np.uint8, nbytes)
        raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"{what}: unknown buffer kind {kind!r}")

    def tensor(self, desc, what: str) -> np.ndarray:
        """A kernel's argument ``[ptr, shape, dtype]`` as a typed view of device memory."""
        ptr, shape, dtype = desc
        dt = np_dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        raw = self.device_view(ptr, nbytes, what)
        return raw.view(dt).reshape(shape)

    # ---------------------------------------------------------------- the card's own commands
    def c_hello(self, conn: Connection, pid: int, label: str = "client"):
        conn.pid, conn.label = pid, label
        return {"node": self.node, "card": self.index, "soc_name": self.soc_name, "conn": conn.id,
                "total_memory": self.memory.mem_info()[1], "cards_per_node": self.cards_per_node,
                "pid": os.getpid()}

    def c_ping(self, conn):
        return True

    def c_usage(self, conn):
        """What ``npu-smi`` shows (``launcher/smi.py``): the card's memory as ``get_mem_info`` and
        ``memory_stats`` report it, and every other connection — its process id, label and the device memory it
        holds. Read-only; the asking connection and other monitors (label ``MONITOR_LABEL``) are left out."""
        free, total = self.memory.mem_info()
        stats = self.memory.stats()
        held = self.memory.owner_usage()
        with self.lock:
            conns = [c for c in self.conns.values() if c is not conn and c.label != MONITOR_LABEL]
            streams, events = len(self.streams), len(self.events)
        return {"node": self.node, "card": self.index, "soc_name": self.soc_name, "pid": os.getpid(),
                "fabric": self.fabric, "scope": self.scope, "free": free, "total": total,
                "allocated": stats["allocated_bytes.all.current"], "reserved": stats["reserved_bytes.all.current"],
                "peak_reserved": stats["reserved_bytes.all.peak"], "streams": streams, "events": events,
                "connections": [{"conn": c.id, "pid": c.pid, "label": c.label,
                                 "allocations": held.get(c.id, (0, 0))[0], "bytes": held.get(c.id, (0, 0))[1]}
                                for c in sorted(conns, key=lambda c: c.id)]}

    def c_release(self, conn):
        """The context is being destroyed: free everything it owns (the connection stays open)."""
        self.disconnect(conn)
        conn.closed = False
        with self.lock:
            self.conns[conn.id] = conn
        conn.default_stream = None


def _merge(*tables: dict) -> dict:
    """One table of several parts' tables; a name is served by one part only."""
    merged: dict = {}
    for table in tables:
        assert not merged.keys() & table.keys(), f"card commands served twice: {merged.keys() & table.keys()}"
        merged.update(table)
    return merged


def _raiser(exc: NpuError):
    """A task body that fails with ``exc`` when the stream reaches it (validation failed at enqueue)."""
    def fail():
        raise exc
    return fail
