"""The card's stream and event commands: create, destroy (draining), query, share progress with the host,
synchronize (replies deferred until the stream gets there), records, waits, notifications, callbacks."""

from __future__ import annotations

import collections
import threading

import numpy as np

from ..constants import AclErrorCode as E
from ..constants import EventRecordedStatus, StreamStatus
from ..errors import AclError, NpuError, from_wire
from ..wire.segment import Segment
from .dispatch import DEFERRED, with_fds
from .queues import CardEvent, Task

STATE_PAGE = 4096          # bytes of shared stream state per connection: 16 bytes per stream


class StreamCommands:
    """``c_*`` / ``t_*`` handlers of ``Card`` for streams, events and callbacks (a mixin)."""

    # -- the task log (flight recorder, timeline) -----------------------------------------------------
    def c_trace_config(self, conn, length: int, memory: bool):
        """Keep the last ``length`` tasks per stream of this connection (0: the default), sampling the card's
        memory in use at each task end if ``memory`` (for the timeline's counter track)."""
        if not isinstance(length, int) or not 0 <= length <= 1 << 22:
            raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"trace_config: length {length!r} is not in [0, 4194304]")
        conn.trace = (length, bool(memory))
        with self._lock:
            mine = [s for s in self.streams.values() if s.owner is conn]
        for s in mine:
            self._trace_stream(conn, s)

    def _trace_stream(self, conn, s) -> None:
        length, memory = conn.trace
        if length and s.log.maxlen != length:
            s.log = collections.deque(s.log, maxlen=length)
        s.sampler = (lambda: self.memory.capacity - self.memory.mem_info()[0]) if memory else None

    def c_trace_tasks(self, conn):
        """``{stream id: task log}`` of every stream of this connection (also destroyed ones still draining),
        with the card's monotonic clock now: ``[now ns, {sid: [[label, host index, start, end, ok, note,
        memory], ...]}]`` (end 0: running)."""
        import time
        with self._lock:
            mine = [s for s in self.streams.values() if s.owner is conn] + list(conn.draining)
        # keyed as the host names them: its default stream is 0
        return [time.monotonic_ns(), {str(0 if s is conn.default_stream else s.id): s.task_log() for s in mine}]

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
            return with_fds([slot, STATE_PAGE], [conn.state_page.fd])
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
        ev = CardEvent(next(self._ids), conn)
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
                conn.callbacks.pop(cb_id, None)
                raise AclError(E.ACL_ERROR_WAIT_CALLBACK_TIMEOUT,
                               f"launch_callback: host callback {cb_id} did not return within {timeout} s")
            failure = conn.callback_failures.pop(cb_id, None)
            if failure is not None:                # the callback raised an NpuError: the stream fails with it
                raise from_wire(failure)
        return run

    def c_callback_done(self, conn, cb_id, failure=None):
        ev = conn.callbacks.pop(cb_id, None)
        if ev is not None:
            if isinstance(failure, list) and len(failure) == 3 and isinstance(failure[1], int):
                conn.callback_failures[cb_id] = [str(failure[0]), failure[1], str(failure[2])]
            ev.set()
