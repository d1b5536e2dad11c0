"""The card's stream part: streams and events — create, destroy (draining), query, share progress with the host,
synchronize (replies deferred until the stream gets there), records, waits, notifications, callbacks — and each
stream's task log."""

from __future__ import annotations

import threading
import time

import numpy as np

from ..constants import AclErrorCode as E
from ..constants import EventRecordedStatus, StreamStatus
from ..errors import AclError, NpuError, from_wire
from ..wire.segment import Segment
from .dispatch import DEFERRED, with_fds
from .queues import CardEvent, Task

STATE_PAGE = 4096          # bytes of shared stream state per connection: 16 bytes per stream


class StreamCommands:
    """The stream, event and callback commands and tasks of ``card``, in the tables ``commands`` and ``tasks``
    (wire name → handler, as ``Card.handle`` calls them)."""

    def __init__(self, card):
        self.card = card
        self.commands = {
            "trace_config": self.c_trace_config,
            "trace_tasks": self.c_trace_tasks,
            "stream_create": self.c_stream_create,
            "default_stream": self.c_default_stream,
            "stream_destroy": self.c_stream_destroy,
            "stream_query": self.c_stream_query,
            "stream_share": self.c_stream_share,
            "stream_sync": self.c_stream_sync,
            "device_sync": self.c_device_sync,
            "event_create": self.c_event_create,
            "event_destroy": self.c_event_destroy,
            "event_query": self.c_event_query,
            "event_sync": self.c_event_sync,
            "event_wait": self.c_event_wait,
            "event_elapsed": self.c_event_elapsed,
            "callback_done": self.c_callback_done,
        }
        self.tasks = {
            "record": self.t_record,
            "reset_event": self.t_reset_event,
            "wait_event": self.t_wait_event,
            "notify": self.t_notify,
            "callback": self.t_callback,
        }

    # -- the task log (flight recorder, timeline) -----------------------------------------------------
    def c_trace_config(self, conn, length: int, memory: bool):
        """Keep the last ``length`` tasks per stream of this connection (0: the default), sampling the card's
        memory in use at each task end if ``memory`` (for the timeline's counter track)."""
        if not isinstance(length, int) or not 0 <= length <= 1 << 22:
            raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, f"trace_config: length {length!r} is not in [0, 4194304]")
        conn.trace = (length, bool(memory))
        card = self.card
        with card.lock:
            mine = [s for s in card.streams.values() if s.owner is conn]
        for s in mine:
            card.trace_stream(conn, s)

    def c_trace_tasks(self, conn):
        """``{stream id: task log}`` of every stream of this connection (also destroyed ones still draining),
        with the card's monotonic clock now: ``[now ns, {sid: [[label, host index, start, end, ok, note,
        memory], ...]}]`` (end 0: running)."""
        with self.card.lock:
            mine = [s for s in self.card.streams.values() if s.owner is conn] + list(conn.draining)
        # keyed as the host names them: its default stream is 0
        return [time.monotonic_ns(), {str(0 if s is conn.default_stream else s.id): s.task_log() for s in mine}]

    def c_stream_create(self, conn):
        return self.card.new_stream(conn).id

    def c_default_stream(self, conn):
        return self.card.stream(conn, 0).id

    def c_stream_destroy(self, conn, sid):
        s = self.card.stream(conn, sid)
        if s is conn.default_stream:
            raise AclError(E.ACL_ERROR_RT_PARAM_INVALID, "destroy_stream: the default stream cannot be destroyed")
        with self.card.lock:
            self.card.streams.pop(sid, None)
        slot = s.unshare_state()          # before reuse: the draining worker must not publish into it
        if slot >= 0:
            conn.state_free.append(slot)
        conn.draining.add(s)              # synchronize_device still covers what it holds

        def drain():
            s.close()
            conn.draining.discard(s)
        threading.Thread(target=drain, name=f"npu-drain-{sid}", daemon=True).start()

    def c_stream_query(self, conn, sid):
        s = self.card.stream(conn, sid)
        return int(StreamStatus.ACL_STREAM_STATUS_COMPLETE if s.idle() else StreamStatus.ACL_STREAM_STATUS_NOT_READY)

    def c_stream_share(self, conn, sid):
        """Publish stream ``sid``'s progress in a page the host maps: ``[slot, page size]`` plus the page's
        fd (on the first request of the connection only), or None when the page is full."""
        s = self.card.stream(conn, sid)
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
        s = self.card.stream(conn, sid)
        s.push(Task("synchronize", lambda: self.card.reply_later(conn, req, s.take_errors())))
        return DEFERRED

    def c_device_sync(self, conn, req):
        """Reply once every stream of the connection — also destroyed ones still draining — got here."""
        with self.card.lock:
            mine = [s for s in self.card.streams.values() if s.owner is conn]
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
                self.card.reply_later(conn, req, errs[0] if errs else None)

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
        card = self.card
        ev = CardEvent(card.new_id(), conn)
        with card.lock:
            card.events[ev.id] = ev
        return ev.id

    def c_event_destroy(self, conn, eid):
        self._event(eid)
        with self.card.lock:
            self.card.events.pop(eid, None)

    def c_event_query(self, conn, eid):
        done = self._event(eid).is_complete()
        return int(EventRecordedStatus.ACL_EVENT_RECORDED_STATUS_COMPLETE if done
                   else EventRecordedStatus.ACL_EVENT_RECORDED_STATUS_NOT_READY)

    def c_event_sync(self, conn, eid, gen, req):
        self._event(eid).on_complete(gen, lambda: self.card.reply_later(conn, req))
        return DEFERRED

    def c_event_wait(self, conn, eid, gen, req):
        """For peer cards: reply once event ``eid`` reached generation ``gen`` (never blocks the reader)."""
        self._event(eid).on_complete(gen, lambda: self.card.reply_later(conn, req))
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
        if tuple(card) == (self.card.node, self.card.index):
            ev = self._event(eid)

            def wait_local():
                if not ev.wait(gen, timeout, alive=lambda: not stream.closed):
                    raise AclError(E.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
                                   f"stream_wait_event: event {eid} not completed within {timeout} s")
            return wait_local
        peers = self.card.peers
        if peers is None:
            raise AclError(E.ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "stream_wait_event: no peer link to other cards")
        return lambda: peers.wait_event(tuple(card), eid, gen, timeout)

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

    def _event(self, eid: int) -> CardEvent:
        ev = self.card.events.get(eid)
        if ev is None:
            raise AclError(E.ACL_ERROR_RT_INVALID_HANDLE,
                           f"event {eid} does not exist on {self.card.where} (destroyed?)")
        return ev
