"""A simulated card as a plain Python object: memory, streams, events, kernels, models.

The card serves *connections* (one per host context, or per peer card). A connection is any object
with ``id``, ``pid`` and ``send(msg, fds=())``; transports (in-process, Unix socket, Ray) deliver
decoded messages to :meth:`Card.handle`. Messages are msgpack-able lists:

- ``[CALL, req_id, name, args]``  → handler ``c_<name>(conn, *args)``; reply ``[req_id, ok, value]``
  (handlers may reply later, e.g. synchronize markers, by returning ``DEFERRED``);
- ``[TASK, stream_id, name, args]`` → ``t_<name>(conn, stream, *args)`` validates and resolves at
  once (in program order) and returns the closure the stream's worker runs; no reply.

Notifications to the host are ``[0, kind, payload]``. Everything a connection created on the card
(allocations, streams, events, models, mapped host buffers) is released when it closes.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
import time

import numpy as np

from . import errors
from .constants import AclErrorCode as E
from .constants import EventRecordedStatus, StreamStatus, np_dtype
from .errors import AclError, NpuError
from .kernels import registry
from .memory import DeviceMemory, decode_addr
from .stream import Event, Stream, Task, forward_warnings

CALL, TASK = 0, 1
DEFERRED = object()
STATE_PAGE = 4096          # bytes of shared stream state per connection: 16 bytes per stream


class Connection:
    """Per-connection state on the card (one host context or one peer card)."""

    _ids = itertools.count(1)

    def __init__(self, send, pid: int = 0, label: str = "client"):
        self.id = next(self._ids)
        self.send = send                  # send(msg, fds=()) -> None
        self.pid = pid
        self.label = label
        self.host_buffers: dict[int, tuple[mmap.mmap, np.ndarray]] = {}
        self.pending_fds: list[int] = []  # fds received ahead of the message that claims them
        self.default_stream: Stream | None = None
        self.callbacks: dict[int, threading.Event] = {}
        self.state_page = None            # Segment with [host_done, errors] per shared stream (see c_stream_share)
        self.state_slots = 0
        self.state_free: list[int] = []   # slots of destroyed streams, for reuse
        self.orphan_errors: list[NpuError] = []   # tasks for streams that no longer exist (see Card._task)
        self.draining: set[Stream] = set()        # destroyed streams still running what they held
        self.bad_messages = 0
        self.closed = False

    def __repr__(self) -> str:
        return f"{self.label} {self.id} (pid {self.pid})"


class Card:
    """One simulated NPU. Thread-safe; driven by :meth:`handle` from any number of transports."""

    def __init__(self, *, node: int = 0, index: int = 0, capacity: int = 2 << 30, soc_name: str = "Ascend910B1",
                 small_segment: int = 2 << 20, large_segment: int = 20 << 20, cards_per_node: int = 8):
        self.node, self.index = node, index
        self.where = f"card {index} (node {node})"
        self.soc_name = soc_name
        self.cards_per_node = cards_per_node
        self.memory = DeviceMemory(node=node, card=index, capacity=capacity,
                                   small_segment=small_segment, large_segment=large_segment)
        forward_warnings()
        self.streams: dict[int, Stream] = {}
        self.events: dict[int, Event] = {}
        self.conns: dict[int, Connection] = {}
        self.user_kernels: dict[str, object] = {}
        self.peers = None                 # set by the transport: resolves other cards' memory and events
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        from .mdl.store import ModelStore
        self.models = ModelStore(self.memory)
        self._hccl = None

    @property
    def hccl(self):
        """The card's HCCL service (communicator endpoints), created on first use."""
        if self._hccl is None:
            from hccl.service import HcclService
            with self._lock:
                if self._hccl is None:
                    self._hccl = HcclService(self)
        return self._hccl

    # ---------------------------------------------------------------- connections
    def connect(self, send, pid: int = 0, label: str = "client") -> Connection:
        conn = Connection(send, pid, label)
        with self._lock:
            self.conns[conn.id] = conn
        return conn

    def disconnect(self, conn: Connection) -> None:
        """Release everything ``conn`` created (its process reset the device, exited or died)."""
        if conn.closed:
            return
        conn.closed = True
        for ev in conn.callbacks.values():
            ev.set()
        with self._lock:
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
        if self._hccl is not None:
            self._hccl.release_owner(conn)
        self.memory.free_owner(conn.id)
        for mm, _ in conn.host_buffers.values():
            _close_map(mm)
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
        if self._hccl is not None:
            self._hccl.close()
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
            fn = getattr(self, "c_" + name, None)
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
        if isinstance(result, tuple) and len(result) in (2, 3) and result[0] is _WITH_FDS:
            value, fds_out = result[1]
            try:
                conn.send([tag, True, value], fds_out)
            finally:
                if len(result) == 3 and result[2] == "close":    # fds obtained just for this reply
                    for fd in fds_out:
                        os.close(fd)
            return
        conn.send([tag, True, result])

    def _task(self, conn: Connection, sid: int, name: str, args) -> None:
        try:
            stream = self._stream(conn, sid)
        except NpuError as e:
            # No such stream (destroyed while another host thread enqueued on it): the task cannot run
            # anywhere in order, so its error waits for the context's next synchronize_device.
            conn.orphan_errors.append(type(e)(e.code, f"task {name} on stream {sid}: {e.message}"))
            return
        label = f"{name}#{stream.enqueued + 1}"
        try:
            prep = getattr(self, "t_" + name, None)
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
            conn.send([req, True, value])

    # ---------------------------------------------------------------- lookups
    def _stream(self, conn: Connection, sid: int) -> Stream:
        if sid == 0:
            if conn.default_stream is None:
                conn.default_stream = self._new_stream(conn)
            return conn.default_stream
        s = self.streams.get(sid)
        if s is None:
            raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE, f"stream {sid} does not exist on {self.where} (destroyed?)")
        if s.owner is not conn:
            raise AclError(E.ACL_ERROR_RT_STREAM_CONTEXT,
                           f"stream {sid} belongs to another context ({s.owner}), not {conn}")
        return s

    def _new_stream(self, conn: Connection) -> Stream:
        s = Stream(next(self._ids), conn, self.where)
        with self._lock:
            self.streams[s.id] = s
        return s

    def _event(self, eid: int) -> Event:
        ev = self.events.get(eid)
        if ev is None:
            raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE, f"event {eid} does not exist on {self.where} (destroyed?)")
        return ev

    def device_view(self, ptr: int, nbytes: int, what: str) -> np.ndarray:
        """A checked uint8 view of device memory on this card or, through ``peers``, another card."""
        where = decode_addr(ptr) if isinstance(ptr, int) else None
        if where is not None and where != (self.node, self.index) and self.peers is not None:
            return self.peers.view(where, ptr, nbytes, what)
        return self.memory.view(ptr, nbytes, what=what)

    def _region(self, conn: Connection, desc, nbytes: int, what: str) -> np.ndarray:
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

    def _tensor(self, desc, what: str) -> np.ndarray:
        ptr, shape, dtype = desc
        dt = np_dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        raw = self.device_view(ptr, nbytes, what)
        return raw.view(dt).reshape(shape)

    # ================================================================ sync commands (c_*)
    def c_hello(self, conn: Connection, pid: int, label: str = "client"):
        conn.pid, conn.label = pid, label
        return {"node": self.node, "card": self.index, "soc_name": self.soc_name, "conn": conn.id,
                "total_memory": self.memory.mem_info()[1], "cards_per_node": self.cards_per_node}

    def c_ping(self, conn):
        return True

    def c_malloc(self, conn, size, policy=0):
        return self.memory.malloc(size, policy, owner=conn.id)

    def c_free(self, conn, ptr):
        with self._lock:
            streams = list(self.streams.values()) + [d for c in self.conns.values() for d in c.draining]
        pending = [s.busy_until(s.enqueued) for s in streams if not s.idle()]
        busy = (lambda: any(p() for p in pending)) if pending else None
        self.memory.free(ptr, owner=conn.id, busy=busy)

    def c_mem_info(self, conn):
        return list(self.memory.mem_info())

    def c_memory_stats(self, conn):
        return self.memory.stats()

    def c_empty_cache(self, conn):
        self.memory.empty_cache()

    def c_host_register(self, conn, buf_id, size):
        if not conn.pending_fds:
            raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"host_register: no descriptor arrived for buffer {buf_id:#x}")
        fd = conn.pending_fds.pop(0)
        try:
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
        conn.host_buffers[buf_id] = (mm, np.frombuffer(mm, np.uint8))

    def c_host_unregister(self, conn, buf_id):
        entry = conn.host_buffers.pop(buf_id, None)
        if entry is not None:
            _close_map(entry[0])

    def c_stream_create(self, conn):
        return self._new_stream(conn).id

    def c_default_stream(self, conn):
        return self._stream(conn, 0).id

    def c_stream_destroy(self, conn, sid):
        s = self._stream(conn, sid)
        if s is conn.default_stream:
            raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, "destroy_stream: the default stream cannot be destroyed")
        with self._lock:
            self.streams.pop(sid, None)
        slot = s.unshare_state()          # before reuse: the draining worker must not publish into it
        if slot >= 0:
            conn.state_free.append(slot)
        conn.draining.add(s)              # synchronize_device still covers what it holds

        def drain():
            s.close()
            conn.draining.discard(s)
        threading.Thread(target=drain, name=f"npu-drain-{sid}", daemon=True).start()

    def c_stream_query(self, conn, sid):
        s = self._stream(conn, sid)
        return int(StreamStatus.ACL_STREAM_STATUS_COMPLETE if s.idle() else StreamStatus.ACL_STREAM_STATUS_NOT_READY)

    def c_stream_share(self, conn, sid):
        """Publish stream ``sid``'s progress in a page the host maps: ``[slot, page size]`` plus the page's
        fd (on the first request of the connection only), or None when the page is full."""
        from .segment import Segment
        s = self._stream(conn, sid)
        first = conn.state_page is None
        if first:
            conn.state_page = Segment(STATE_PAGE, name="npusim-stream-state")
            conn.state_page.array[:] = 0
        if s.state is not None:
            slot = s.state_slot
        elif conn.state_free:
            slot = conn.state_free.pop()
        elif conn.state_slots >= STATE_PAGE // 16:
            return None
        else:
            slot, conn.state_slots = conn.state_slots, conn.state_slots + 1
        if s.state is None:
            s.state_slot = slot
            s.share_state(conn.state_page.array[slot * 16: slot * 16 + 16].view(np.int64))
        if first:
            return _WITH_FDS, ([slot, STATE_PAGE], [conn.state_page.fd])
        return [slot, STATE_PAGE]

    def c_stream_sync(self, conn, sid, req):
        """Reply to request ``req`` when the stream reaches this point (with its async errors)."""
        s = self._stream(conn, sid)
        s.push(Task("synchronize", lambda: self.reply_later(conn, req, s.take_errors())))
        return DEFERRED

    def c_device_sync(self, conn, req):
        """Reply once every stream of the connection — also destroyed ones still draining — got here."""
        with self._lock:
            mine = [s for s in self.streams.values() if s.owner is conn]
        draining = list(conn.draining)
        left = [len(mine) + len(draining)]
        lock = threading.Lock()

        def one_done():
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                errs = [e for e in (s.take_errors() for s in mine + draining) if e is not None]
                orphans, conn.orphan_errors = conn.orphan_errors, []
                errs += orphans
                self.reply_later(conn, req, errs[0] if errs else None)

        if not left[0]:
            orphans, conn.orphan_errors = conn.orphan_errors, []
            if orphans:
                raise orphans[0]
            return None
        for s in mine:
            try:
                s.push(Task("synchronize_device", one_done))
            except NpuError:                  # destroyed meanwhile: it reports when drained
                s.when_drained(one_done)
        for s in draining:
            s.when_drained(one_done)
        return DEFERRED

    def c_event_create(self, conn):
        ev = Event(next(self._ids), conn)
        with self._lock:
            self.events[ev.id] = ev
        return ev.id

    def c_event_destroy(self, conn, eid):
        self._event(eid)
        with self._lock:
            self.events.pop(eid, None)

    def c_event_query(self, conn, eid):
        done = self._event(eid).is_complete()
        return int(EventRecordedStatus.ACL_EVENT_RECORDED_STATUS_COMPLETE if done
                   else EventRecordedStatus.ACL_EVENT_RECORDED_STATUS_NOT_READY)

    def c_event_sync(self, conn, eid, gen, req):
        self._event(eid).on_complete(gen, lambda: self.reply_later(conn, req))
        return DEFERRED

    def c_event_wait(self, conn, eid, gen, req):
        """For peer cards: reply once event ``eid`` reached generation ``gen`` (never blocks the reader)."""
        self._event(eid).on_complete(gen, lambda: self.reply_later(conn, req))
        return DEFERRED

    def c_event_elapsed(self, conn, start, end):
        a, b = self._event(start), self._event(end)
        for name, ev in (("start", a), ("end", b)):
            if not ev.is_complete() or ev.timestamp_ns is None:
                raise AclError(E.ACL_ERROR_RT_EVENT_NOT_COMPLETE,
                               f"event_elapsed_time: {name} event {ev.id} has not completed (record it and "
                               f"synchronize first)")
        return (b.timestamp_ns - a.timestamp_ns) / 1e6

    def c_memcpy(self, conn, dst, src, count):
        """Synchronous copy, not ordered with queued stream work (as aclrtMemcpy)."""
        if dst[0] == "ret":
            return bytes(self._region(conn, src, count, "memcpy src"))
        np.copyto(self._region(conn, dst, count, "memcpy dst"), self._region(conn, src, count, "memcpy src"))

    def c_memset(self, conn, ptr, value, count):
        self.device_view(ptr, count, "memset")[:] = value

    def c_kernel_register(self, conn, name, blob):
        """A ``@rt.kernel`` function shipped by value (cloudpickle) from the user's own process."""
        import pickle
        fn = pickle.loads(blob)
        if not callable(fn):
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"kernel_register: {name!r} is not callable")
        self.user_kernels[name] = fn

    def c_callback_done(self, conn, cb_id):
        ev = conn.callbacks.pop(cb_id, None)
        if ev is not None:
            ev.set()

    def c_locate(self, conn, ptr, nbytes, what):
        """For peers: where a range of this card's memory lives (segment id, offset, segment size)."""
        seg, off = self.memory.locate(ptr, nbytes, what=what)
        return [seg, off, self.memory.segment(seg).size]

    def c_locate_own(self, conn, ptr):
        """Where this connection's live allocation ``ptr`` lives — ``[segment, offset, segment size]`` plus the
        segment's fd — so the host can view it (``rt/hostview.py``); None for anything it does not own."""
        try:
            alloc = self.memory.allocation(ptr)
        except AclError:
            return None
        if alloc.owner != conn.id or alloc.start != ptr:
            return None
        seg_id, off = self.memory.locate(ptr, alloc.size)
        seg = self.memory.segment(seg_id)
        return _WITH_FDS, ([seg_id, off, seg.size], [seg.fd])

    def c_export_segment(self, conn, seg_id):
        seg = self.memory.segment(seg_id)
        return _WITH_FDS, (seg.size, [seg.fd])

    def c_model_load(self, conn, data):
        model_id, desc = self.models.load(data, conn.id)
        return [model_id, desc]

    def c_model_unload(self, conn, model_id):
        self.models.unload(model_id, conn.id)

    def c_release(self, conn):
        """The context is being destroyed: free everything it owns (the connection stays open)."""
        self.disconnect(conn)
        conn.closed = False
        with self._lock:
            self.conns[conn.id] = conn
        conn.default_stream = None

    # ---------------------------------------------------------------- HCCL (see hccl/service.py)
    def c_hccl_init(self, conn, comm_id, nranks, rank, options, req):
        """Join communicator ``comm_id``; replies once every rank joined (in a thread: it may wait long)."""
        def run():
            try:
                value = self.hccl.init(conn, comm_id, nranks, rank, options)
            except NpuError as e:
                self.reply_later(conn, req, e)
                return
            except Exception as e:
                self.reply_later(conn, req, AclError(E.ACL_ERROR_RT_INTERNAL_ERROR, f"hccl_init: {type(e).__name__}: {e}"))
                return
            self.reply_later(conn, req, None, value)
        threading.Thread(target=run, name=f"hccl-init-{comm_id}", daemon=True).start()
        return DEFERRED

    def c_hccl_ctrl(self, conn, comm_id, nbytes):
        self.hccl.ctrl_array(comm_id, nbytes)
        seg = self.hccl.ctrl[comm_id]
        return _WITH_FDS, (seg.size, [seg.fd])

    def c_hccl_share(self, conn, comm_id, rank):
        """The control block of ``comm_id`` for the rank's own process (``hccl/hostpath.py``): ``nbytes`` plus
        its fd, from this card or fetched from the node's leader card; None if it cannot be shared."""
        ep = self.hccl.endpoint(comm_id, rank)
        if ep.hub is not None:
            return None
        if ep.leader_card == self.index:
            seg = self.hccl.ctrl[comm_id]
            return _WITH_FDS, (seg.size, [seg.fd])
        fetch = getattr(self.peers, "ctrl_fd", None)
        if fetch is None:
            return None
        size, fds = fetch(ep.leader_card, comm_id, ep.ctrl.raw.size)
        return _WITH_FDS, (size, fds), "close"

    def c_hccl_destroy(self, conn, comm_id, rank):
        self.hccl.destroy(comm_id, rank)

    def t_hccl(self, conn, stream, comm_id, rank, seq, op, params, buffers):
        """A collective: resolve this rank's buffers now (program order), run it when the stream gets here."""
        ep = self.hccl.endpoint(comm_id, rank)
        views = {}
        for name, (ptr, nbytes) in buffers.items():
            seg, off = self.memory.locate(ptr, nbytes, what=f"{op} {name} buffer")
            views[name] = (seg, off, nbytes)
        return lambda: ep.collective(seq, op, params, views)

    def t_hccl_finish(self, conn, stream, comm_id, rank, seq, op, params, buffers, target):
        """The rest of a small collective the host started (staged its input, arrived) and handed over."""
        ep = self.hccl.endpoint(comm_id, rank)
        views = {}
        for name, (ptr, nbytes) in buffers.items():
            seg, off = self.memory.locate(ptr, nbytes, what=f"{op} {name} buffer")
            views[name] = (seg, off, nbytes)
        return lambda: ep.staged_finish(seq, op, params, views, target)

    def t_hccl_p2p(self, conn, stream, comm_id, rank, items):
        """send/recv/batch_send_recv: items are [kind, peer, ptr, count, dtype, nbytes]."""
        ep = self.hccl.endpoint(comm_id, rank)
        resolved = []
        for kind, peer, ptr, count, dtype, nbytes in items:
            seg, off = self.memory.locate(ptr, nbytes, what=f"{kind} buffer")
            resolved.append((kind, peer, (seg, off, nbytes), count, dtype))

        def run():
            for kind, peer, view, count, dtype in resolved:     # sends first: never deadlock a batch
                if kind == "send":
                    ep.post_send(peer, view, count, dtype)
            for kind, peer, view, count, dtype in resolved:
                if kind == "recv":
                    ep.recv(peer, view, count, dtype)
            for kind, peer, view, count, dtype in resolved:
                if kind == "send":
                    ep.wait_send(peer)
        return run

    # ================================================================ stream tasks (t_*)
    def t_memcpy(self, conn, stream, dst, src, count):
        d = self._region(conn, dst, count, "memcpy_async dst")
        s = self._region(conn, src, count, "memcpy_async src")
        return lambda: np.copyto(d, s)

    def t_memset(self, conn, stream, ptr, value, count):
        d = self.device_view(ptr, count, "memset_async")

        def run():
            d[:] = value
        return run

    def t_kernel(self, conn, stream, name, inputs, outputs, attrs):
        ins = [self._tensor(t, f"{name} input {i}") for i, t in enumerate(inputs)]
        outs = [self._tensor(t, f"{name} output {i}") for i, t in enumerate(outputs)]
        user = self.user_kernels.get(name)
        if user is not None:
            return lambda: user(*ins, *outs, **attrs)
        op = registry.get_op(name)
        return lambda: op.compute(ins, outs, attrs)

    def t_sleep(self, conn, stream, seconds):
        return lambda: time.sleep(seconds)

    def t_record(self, conn, stream, eid, gen):
        ev = self._event(eid)
        ev.mark_recorded(gen)
        return lambda: ev.complete(gen)

    def t_reset_event(self, conn, stream, eid):
        return self._event(eid).reset

    def t_wait_event(self, conn, stream, card, eid, gen, timeout):
        if tuple(card) == (self.node, self.index):
            ev = self._event(eid)

            def wait_local():
                if not ev.wait(gen, timeout, alive=lambda: not stream.closed):
                    raise AclError(E.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
                                   f"stream_wait_event: event {eid} not completed within {timeout} s")
            return wait_local
        if self.peers is None:
            raise AclError(E.ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "stream_wait_event: no peer link to other cards")
        return lambda: self.peers.wait_event(tuple(card), eid, gen, timeout)

    def t_notify(self, conn, stream, token):
        return lambda: conn.closed or conn.send([0, "notify", token])

    def t_callback(self, conn, stream, cb_id, block, timeout):
        def run():
            if conn.closed:
                return
            if not block:
                conn.send([0, "callback", cb_id])
                return
            done = threading.Event()
            conn.callbacks[cb_id] = done
            conn.send([0, "callback", cb_id])
            if not done.wait(timeout):
                raise AclError(E.ACL_ERROR_WAIT_CALLBACK_TIMEOUT,
                               f"launch_callback: host callback {cb_id} did not return within {timeout} s")
        return run

    def t_model_execute(self, conn, stream, model_id, inputs, outputs, dynamic):
        return lambda: self.models.execute(model_id, inputs, outputs, dynamic)


_WITH_FDS = object()


def _raiser(exc: NpuError):
    """A task body that fails with ``exc`` when the stream reaches it (validation failed at enqueue)."""
    def fail():
        raise exc
    return fail


def _close_map(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        pass  # views still alive in a queued task; the mapping goes with them
