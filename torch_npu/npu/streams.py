"""``torch_npu.npu.streams``: the card's streams and events (defined in ``torch_npu/streams.py``)."""

from ..streams import Event, Stream, StreamContext, current_stream, default_stream, set_stream, stream

__all__ = ["Event", "Stream", "StreamContext", "current_stream", "default_stream", "set_stream", "stream"]
