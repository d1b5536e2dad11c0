"""``torch.npu.Stream`` / ``torch.npu.Event`` and the current stream, on npusim's stream and event handles.

A ``Stream`` is an ``rt`` stream of the card its device index names (``rt.create_stream`` in that card's
context; ``default_stream(i)`` is the card's default stream); an ``Event`` is an ``rt`` event created, as in
torch_npu, on the card of the stream it is first recorded on. ``record`` / ``wait`` / ``query`` /
``synchronize`` / ``elapsed_time`` are the card's own (``rt.record_event``, ``rt.stream_wait_event``, ...), so
ordering and timing between streams are the runtime's. The current stream is kept per thread and per device,
as in torch; ``Stream`` derives from ``torch.Stream`` (``device_type`` is PrivateUse1, named ``npu``).
"""

from __future__ import annotations

import threading

import torch

import rt
from rt.host.streams import stream_handle

from . import _runtime
from ._error_code import ErrCode, pta_error
from .distributed import bootstrap

PRIVATEUSE1 = 20                          # c10::DeviceType::PrivateUse1, the ``npu`` device type
_registry: dict[tuple[int, int], Stream] = {}   # (device index, stream id) -> Stream
_lock = threading.Lock()
_tls = threading.local()


def device_index(device, optional: bool = True) -> int:
    """torch_npu's ``_get_device_index``: an int as is; "npu:N" / torch.device; None → the current device."""
    if isinstance(device, bool):
        raise ValueError(f"Expected a npu device, but got: {device!r}" + pta_error(ErrCode.VALUE))
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "npu":
            raise ValueError(f"Expected a npu device, but got: {device}" + pta_error(ErrCode.VALUE))
        if device.index is not None:
            return device.index
    elif device is not None and hasattr(device, "idx"):           # a torch.npu.device context object
        return device.idx
    elif device is not None:
        raise ValueError(f"Expected a npu device, but got: {device!r}" + pta_error(ErrCode.VALUE))
    if not optional:
        raise ValueError(f"Expected a npu device with a specified index or an integer, but got: {device}"
                         + pta_error(ErrCode.VALUE))
    return bootstrap.current_device()


def _live(stream):
    """``stream`` if its runtime handle is still usable (the runtime may have been finalized since), else None."""
    if stream is None or stream._rt.destroyed or stream._rt.ctx.destroyed:
        return None
    return stream


def _wrap(index: int, handle: rt.Stream) -> Stream:
    with _lock:
        known = _registry.get((index, handle.id))
        if known is not None and known._rt is handle:
            return known
        obj = torch.Stream.__new__(Stream, stream_id=handle.id, device_index=index, device_type=PRIVATEUSE1)
        obj._rt = handle
        _registry[(index, handle.id)] = obj
        return obj


class Stream(torch.Stream):
    """A stream of an NPU (``torch.npu.Stream(device=None, priority=0)``): a new ``rt`` stream on that card."""

    def __new__(cls, device=None, priority=0, **kwargs):
        if {"stream_id", "device_index", "device_type"} & kwargs.keys():
            return _from_ids(kwargs.get("stream_id", 0), kwargs.get("device_index", 0))
        if kwargs:
            raise TypeError(f"Stream() got unexpected keyword arguments {sorted(kwargs)}")
        index = device_index(device)
        index = bootstrap.current_device() if index < 0 else index
        with _runtime.on(index):
            handle = rt.create_stream()
        return _wrap(index, handle)

    def __init__(self, *args, **kwargs):
        pass

    @property
    def npu_stream(self) -> int:
        """The card's id of this stream (0: the default stream)."""
        return self._rt.id

    @property
    def priority(self):
        raise RuntimeError("NPU dose not support Stream.get_priority() currently." + pta_error(ErrCode.NOT_SUPPORT))

    @staticmethod
    def priority_range():
        raise RuntimeError("NPU does not support Stream.priority_range() currently." + pta_error(ErrCode.NOT_SUPPORT))

    def wait_event(self, event) -> None:
        """Future work on this stream waits for ``event`` (returns at once)."""
        event.wait(self)

    def wait_stream(self, stream) -> None:
        """Future work on this stream waits for the work queued on ``stream`` now."""
        self.wait_event(stream.record_event())

    def record_event(self, event=None):
        event = Event() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        return rt.stream_query(self._rt) == rt.StreamStatus.ACL_STREAM_STATUS_COMPLETE

    def synchronize(self) -> None:
        rt.synchronize_stream(self._rt)

    def __enter__(self):
        """``with stream:`` — the current stream of its device for the body (as ``torch.npu.stream(s)``)."""
        ctx = StreamContext(self)
        self.__dict__.setdefault("_contexts", []).append(ctx)
        ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self.__dict__["_contexts"].pop().__exit__(*exc)
        return False

    def set_data_preprocess_stream(self, is_data_preprocess_stream=False) -> None:
        """Accepted (a scheduling hint on hardware; every stream of a simulated card is scheduled alike)."""

    def __eq__(self, other):
        return isinstance(other, Stream) and (self.device_index, self.stream_id) == (other.device_index,
                                                                                     other.stream_id)

    def __hash__(self):
        return hash((self.stream_id, self.device_index))

    def __repr__(self):
        return f"<torch_npu.npu.Stream device={self.device} npu_stream={self.npu_stream:#x}>"


def _from_ids(stream_id: int, index: int) -> Stream:
    known = _live(_registry.get((index, stream_id)))
    if known is not None:
        return known
    if stream_id == 0:
        return default_stream(index)
    raise RuntimeError(f"Stream(stream_id={stream_id}, device_index={index}): no such stream was created by "
                       f"this process" + pta_error(ErrCode.PARAM))


class Event:
    """An NPU event (``torch.npu.Event(enable_timing=False, blocking=False, interprocess=False)``), created on
    the card of the stream it is first recorded on."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        if interprocess:
            raise RuntimeError("Parameter interprocess is not supported, please upgrade the HDK(driver) or CANN "
                               "package." + pta_error(ErrCode.NOT_SUPPORT))
        self.enable_timing = bool(enable_timing)
        self.blocking = bool(blocking)
        self._rt = None
        self._index = None

    @property
    def device(self):
        return None if self._index is None else torch.device("npu", self._index)

    @property
    def npu_event(self) -> int:
        return 0 if self._rt is None else self._rt.id

    def record(self, stream=None) -> None:
        stream = current_stream() if stream is None else stream
        if self._rt is None:
            with _runtime.on(stream.device_index):
                self._rt = rt.create_event()
            self._index = stream.device_index
        elif self._index != stream.device_index:
            raise RuntimeError(f"Event device {self._index} does not match recording stream's device "
                               f"{stream.device_index}." + pta_error(ErrCode.PARAM))
        rt.record_event(self._rt, stream._rt)

    def wait(self, stream=None) -> None:
        """Future work on ``stream`` (default: the current one) waits for this event's latest record."""
        if self._rt is None:
            return
        stream = current_stream() if stream is None else stream
        rt.stream_wait_event(stream._rt, self._rt)

    def query(self) -> bool:
        if self._rt is None:
            return True
        return rt.query_event_status(self._rt) == rt.EventRecordedStatus.ACL_EVENT_RECORDED_STATUS_COMPLETE

    def synchronize(self) -> None:
        if self._rt is not None:
            rt.synchronize_event(self._rt)

    def elapsed_time(self, end_event) -> float:
        """Milliseconds between this event's record and ``end_event``'s, measured on the card."""
        if self._rt is None or end_event._rt is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time."
                               + pta_error(ErrCode.INTERNAL))
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True' to measure elapsed "
                               "time." + pta_error(ErrCode.PARAM))
        self.synchronize()
        end_event.synchronize()
        return float(rt.event_elapsed_time(self._rt, end_event._rt))

    def __repr__(self):
        if self._rt is None:
            return "<torch_npu.npu.Event uninitialized>"
        return f"<torch_npu.npu.Event {self.npu_event:#x}>"


def default_stream(device=None) -> Stream:
    """The default stream of a device (its card's default stream)."""
    index = device_index(device)
    known = _live(_registry.get((index, 0)))
    if known is not None:
        return known
    with _runtime.on(index):
        handle = stream_handle(None, "default_stream")
    return _wrap(index, handle)


def current_stream(device=None) -> Stream:
    """This thread's current stream of a device: the one ``set_stream`` / ``stream(s)`` chose, else the default."""
    index = device_index(device)
    chosen = _live(getattr(_tls, "current", {}).get(index))
    return chosen if chosen is not None else default_stream(index)


def set_stream(stream) -> None:
    """Make ``stream`` this thread's current stream of its device (``None``: no-op)."""
    if stream is None:
        return
    if not hasattr(_tls, "current"):
        _tls.current = {}
    _tls.current[stream.device_index] = stream


class StreamContext:
    """Selects ``stream`` as the current stream for the body (its device's; ``None``: no-op)."""

    def __init__(self, stream):
        self.stream = stream
        self.src_prev_stream = None
        self.dst_prev_stream = None

    def __enter__(self):
        cur = self.stream
        if cur is None:
            return
        self.src_prev_stream = current_stream()
        if self.src_prev_stream.device != cur.device:
            self.dst_prev_stream = current_stream(cur.device)
        set_stream(cur)

    def __exit__(self, *exc):
        cur = self.stream
        if cur is None:
            return
        if self.src_prev_stream.device != cur.device:
            set_stream(self.dst_prev_stream)
        set_stream(self.src_prev_stream)


def stream(stream) -> StreamContext:
    return StreamContext(stream)


__all__ = ["Event", "Stream", "StreamContext", "current_stream", "default_stream", "set_stream", "stream"]
