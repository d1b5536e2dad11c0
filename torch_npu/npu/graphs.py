"""``torch.npu`` graph capture (``NPUGraph``, ``graph``, ``make_graphed_callables``): not simulated.

On hardware a captured graph replays the kernels queued on a stream. npusim's operators run on the host when they
are called and queue nothing on the card, so there is nothing to capture or replay: the graph names raise an error
saying so (rather than being absent, so a script's graph path fails at the call with the reason), and
``is_current_stream_capturing`` truthfully answers False — no capture can be under way.
"""

from __future__ import annotations

from .._error_code import ErrCode, pta_error

__all__ = ["NPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed_callables"]


def _unsupported(call: str) -> RuntimeError:
    return RuntimeError(f"torch.npu.{call}: npusim does not simulate NPU graph capture (operators run on the host "
                        f"when called and queue nothing on the card to capture or replay); run the model eagerly"
                        + pta_error(ErrCode.NOT_SUPPORT))


def is_current_stream_capturing() -> bool:
    """False: no stream can be capturing (graph capture is not simulated)."""
    return False


class NPUGraph:
    """torch_npu's captured graph: refused at construction (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        raise _unsupported("NPUGraph")


class graph:
    """torch_npu's capture context manager: refused at construction (see the module docstring)."""

    def __init__(self, npu_graph, pool=None, stream=None, capture_error_mode: str = "global"):
        raise _unsupported("graph")


def graph_pool_handle():
    raise _unsupported("graph_pool_handle")


def make_graphed_callables(callables, sample_args, num_warmup_iters=3, allow_unused_input=False, pool=None):
    raise _unsupported("make_graphed_callables")
