"""Bounds on the work and memory a model file can cause (a model file may be hostile).

Three kinds of bound, all checked before the expensive step they protect:

- **decode work**: :class:`ItemBudget` counts every array element and map entry msgpack builds and
  stops the decode once the document holds more than ``MAX_ITEMS`` of them, so a file of a few
  hundred MiB of tiny objects cannot make the host build a billion Python objects;
- **graph size**: at most ``MAX_NODES`` nodes, ``MAX_WEIGHTS`` weights and ``MAX_IO`` inputs or
  outputs. Nothing in the loader or the executor recurses over the graph (topological sort and
  execution are iterative), so a chain as long as the node cap is no deeper problem than a wide
  graph; depth is bounded by the node count;
- **declared bytes**: every input, output, weight and intermediate declares at most
  ``MAX_TENSOR_BYTES`` (all size arithmetic then stays in int64 on the wire); a card further
  refuses a model whose tensors at its largest input shapes do not fit its HBM
  (:func:`check_fits_card`).

The caps sit far above real exports (a BERT-base or ResNet-50 ONNX graph has a few thousand nodes
and a few hundred weights) while keeping the worst accepted file well under a second to parse.
"""

from __future__ import annotations

import math

MAX_NODES = 1 << 15
MAX_WEIGHTS = 1 << 15
MAX_IO = 1 << 12  # model inputs, model outputs
MAX_ITEMS = 1 << 21  # array elements + map entries of the whole document (a node costs ~10)
MAX_TENSOR_BYTES = 1 << 48  # 256 TiB: more than any card, and products stay far inside int64


class TooManyItems(Exception):
    """Raised from inside the msgpack decode when the document exceeds :data:`MAX_ITEMS`."""


class ItemBudget:
    """msgpack ``list_hook`` / ``object_hook`` pair counting the items of every container built.

    Containers are built bottom-up, so the decode stops at most one container (of at most the
    decoder's per-container cap) after the budget is spent.
    """

    def __init__(self, limit: int = MAX_ITEMS):
        self.left = limit

    def _spend(self, container):
        self.left -= len(container)
        if self.left < 0:
            raise TooManyItems(f"the document holds more than {MAX_ITEMS} array elements and map entries")
        return container

    list_hook = object_hook = _spend


def declared_bytes(shape, dtype) -> int:
    """Bytes a tensor declares, a dynamic (-1) dim counting as 1: a lower bound for any execution."""
    return math.prod(1 if d == -1 else d for d in shape) * dtype.itemsize


def human(n: int) -> str:
    """``2 GiB``, ``512 MiB``, ``4096 bytes``: for messages about capacities."""
    for shift, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def check_tensor(kind: str, name: str, shape, dtype, limit: int, fail, whose: str = "") -> None:
    """``fail(where, message)`` unless the tensor's declared bytes fit ``limit``."""
    nbytes = declared_bytes(shape, dtype)
    if nbytes > limit:
        fail(f"{kind} {name!r}", f"dims {_dims(shape)} ({dtype}) declare {nbytes} bytes, "
                                 f"more than {whose or 'the limit of'} {human(limit)}")


def _dims(shape) -> str:
    text = str(list(shape))
    return text if len(text) <= 80 else text[:77] + "..."


def check_counts(doc_lists: dict, fail) -> None:
    """The graph-size caps on the decoded (still unvalidated) top-level arrays."""
    for key, cap in (("inputs", MAX_IO), ("outputs", MAX_IO), ("nodes", MAX_NODES), ("weights", MAX_WEIGHTS)):
        items = doc_lists.get(key)
        if isinstance(items, list) and len(items) > cap:
            fail("model", f"{key} has {len(items)} entries, at most {cap} allowed")


def check_fits_card(model, specs: dict, capacity: int, fail) -> None:
    """A card refuses a model one of whose inputs, outputs or intermediates cannot fit its HBM.

    ``specs`` are the specs of every value at the largest input shapes (for a model with unbounded
    dynamic dims, the symbolic ones: -1 counts as 1). Weights need no check here: their bytes are in
    the file, and copying them to the card fails with a memory-allocation error if they do not fit.
    """
    whose = "the card's"
    for kind, infos in (("input", model.inputs), ("output", model.outputs)):
        for v in infos:
            check_tensor(kind, v.name, specs[v.name].shape, v.dtype, capacity, fail, whose)
    for node in model.nodes:
        for out in node.outputs:
            check_tensor(f"node {node.name!r} output", out, specs[out].shape, specs[out].dtype, capacity, fail, whose)
