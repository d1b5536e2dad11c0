"""Hostile model files (issue #21 items 1, 2, 12): every one is refused with its code and a message naming
the field, quickly and without a large allocation, and the card keeps serving afterwards.

Each case is a small edit of a valid document (or raw bytes). The table runs through ``rt.mdl.load_from_mem``
on the local backend (host parse, then the card's own parse) and, for the cases only the card can judge
(sizes against its HBM), straight through the card's ``model_load`` command — also on a real Ray card actor,
where a hostile model used to kill the card.
"""

import copy

import msgpack
import numpy as np
import pytest

from rt.errors import AclError
from rt.host import devices
from rt.mdl import format as fmt, limits
from rt.mdl.builder import GraphBuilder

PARSE, DESERIALIZE, INVALID_FILE = 100013, 100012, 100003
BIG = (1 << 31) - 1


def base_doc() -> dict:
    """x[2,4] -> MatMul(w[4,4]) -> Relu -> y[2,4]: a valid document to break one field at a time."""
    g = GraphBuilder("hostile")
    x = g.input("x", "float32", [2, 4])
    w = g.constant("w", np.eye(4, dtype=np.float32))
    g.output("y", g.op("Relu", [g.op("MatMul", [x, w], name="mm")], name="relu"))
    return msgpack.unpackb(g.serialize(), raw=False)


BASE = base_doc()


def edited(path: str, value) -> bytes:
    """BASE with the field at ``path`` ("nodes.0.inputs.1") set to ``value`` (``DELETE`` removes it)."""
    doc = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    target = doc
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    key = int(last) if isinstance(target, list) else last
    if value is DELETE:
        del target[key]
    else:
        target[key] = value
    return msgpack.packb(doc, use_bin_type=True)


DELETE = object()


def chain(n: int, shape=(4,)) -> bytes:
    """x -> Relu -> Relu -> ... (n nodes): the longest possible graph depth for its node count."""
    nodes = [{"op": "Relu", "name": f"n{i}", "inputs": ["x" if i == 0 else f"v{i - 1}"], "outputs": [f"v{i}"]}
             for i in range(n)]
    info = {"dtype": "float32", "shape": list(shape)}
    return msgpack.packb({"format": "npusim-om", "version": 1, "name": "chain", "inputs": [{"name": "x", **info}],
                          "outputs": [{"name": f"v{n - 1}", **info}], "nodes": nodes, "weights": []})


def nested(depth: int) -> bytes:
    """A map whose 'nodes' is an array nested ``depth`` levels deep (built as bytes, not recursion)."""
    head = b"\x82" + msgpack.packb("format") + msgpack.packb("npusim-om") + msgpack.packb("nodes")
    return head + b"\x91" * depth + b"\x90"


def item_bomb() -> bytes:
    """~2.2M tiny array elements in a 2 MiB file: over the decode budget, under every per-container cap."""
    row = [0] * 2048
    return msgpack.packb({**BASE, "junk": [row] * 1100})


def graph(inputs, nodes, outputs) -> bytes:
    info = lambda name, shape: {"name": name, "dtype": "float32", "shape": shape}  # noqa: E731
    return msgpack.packb({"format": "npusim-om", "version": 1, "name": "g",
                          "inputs": [info(n, s) for n, s in inputs], "outputs": [info(n, s) for n, s in outputs],
                          "nodes": [{"op": op, "name": name, "inputs": i, "outputs": o} for op, name, i, o in nodes],
                          "weights": []})


# (id, bytes, code, text the message must contain)
CASES = [
    # the bytes themselves
    ("empty", b"", INVALID_FILE, "size 0"),
    ("not-a-map", msgpack.packb([1, 2]), INVALID_FILE, "top level"),
    ("deep-nesting", nested(100_000), DESERIALIZE, "msgpack"),
    ("truncated", msgpack.packb(BASE)[:-7], DESERIALIZE, "msgpack"),
    ("item-bomb", item_bomb(), PARSE, "array elements"),
    # huge numbers and bad dims
    ("version-huge", edited("version", 2**64 - 1), PARSE, "version"),
    ("dim-uint64", edited("inputs.0.shape", [2, 2**64 - 1]), PARSE, "shape"),
    ("dim-negative", edited("inputs.0.shape", [2, -4]), PARSE, "shape"),
    ("dim-float", edited("inputs.0.shape", [2, 4.0]), PARSE, "shape"),
    ("dim-bool", edited("inputs.0.shape", [True, 4]), PARSE, "shape"),
    ("dim-non-ascii-digit", edited("inputs.0.shape", [2, "\u0664"]), PARSE, "shape"),
    ("rank-33", edited("inputs.0.shape", [1] * 33), PARSE, "33 dims"),
    ("weight-dim-dynamic", edited("weights.0.shape", [-1, 4]), PARSE, "weight 'w'"),
    # declared sizes: absurd on any card (refused on the host already)
    ("io-huge", graph([("x", [BIG] * 4)], [("Relu", "r", ["x"], ["y"])], [("y", [BIG] * 4)]), PARSE, "input 'x'"),
    ("input-huge", edited("inputs.0.shape", [BIG] * 4), PARSE, "input 'x'"),
    ("input-huge-dynamic", edited("inputs.0.shape", [-1, BIG, BIG, BIG]), PARSE, "input 'x'"),
    ("output-huge", edited("outputs.0.shape", [BIG] * 4), PARSE, "output 'y'"),
    ("weight-claims-huge", edited("weights.0.shape", [BIG, BIG]), PARSE, "weight 'w'"),
    ("intermediate-huge", graph([("a", [1, BIG, 1 << 12]), ("b", [BIG, 1, 1 << 12])],
                                [("Add", "add", ["a", "b"], ["s"]), ("ReduceSum", "sum", ["s"], ["t"])],
                                [("t", [1, 1, 1])]), PARSE, "node 'add' output 's'"),
    # graph size and shape
    ("nodes-over-cap", chain(limits.MAX_NODES + 1), PARSE, f"nodes has {limits.MAX_NODES + 1} entries"),
    ("cycle", graph([("x", [4])], [("Relu", "a", ["b_out"], ["a_out"]), ("Relu", "b", ["a_out"], ["b_out"])],
                    [("a_out", [4])]), PARSE, "cycle"),
    ("self-loop", graph([("x", [4])], [("Relu", "a", ["a_out"], ["a_out"])], [("a_out", [4])]), PARSE, "cycle"),
    ("dangling-input", edited("nodes.0.inputs.0", "nope"), PARSE, "'nope' is never produced"),
    ("dangling-output", edited("outputs.0.name", "nope"), PARSE, "output 'nope'"),
    ("produced-twice", edited("nodes.1.outputs.0", "mm"), PARSE, "already produced"),
    ("unknown-op", edited("nodes.0.op", "Exec"), PARSE, "node 'mm'"),
    ("declared-output-lies", edited("outputs.0.shape", [2, 5]), PARSE, "output 'y'"),
    # wrong types in every field
    ("format-int", edited("format", 7), INVALID_FILE, "format tag"),
    ("version-str", edited("version", "1"), PARSE, "version"),
    ("name-int", edited("name", 5), PARSE, "'name'"),
    ("inputs-map", edited("inputs", {}), PARSE, "'inputs'"),
    ("inputs-missing", edited("inputs", DELETE), PARSE, "'inputs'"),
    ("input-entry-int", edited("inputs.0", 5), PARSE, "inputs[0]"),
    ("input-name-int", edited("inputs.0.name", 5), PARSE, "'name'"),
    ("input-name-empty", edited("inputs.0.name", ""), PARSE, "'name'"),
    ("input-dtype-int", edited("inputs.0.dtype", 0), PARSE, "'dtype'"),
    ("input-dtype-unknown", edited("inputs.0.dtype", "float128"), PARSE, "dtype 'float128'"),
    ("input-shape-str", edited("inputs.0.shape", "2,4"), PARSE, "'shape'"),
    ("outputs-empty", edited("outputs", []), PARSE, "no outputs"),
    ("output-dtype-none", edited("outputs.0.dtype", None), PARSE, "'dtype'"),
    ("nodes-str", edited("nodes", "x"), PARSE, "'nodes'"),
    ("node-entry-list", edited("nodes.0", ["MatMul"]), PARSE, "nodes[0]"),
    ("node-op-int", edited("nodes.0.op", 3), PARSE, "'op'"),
    ("node-name-none", edited("nodes.0.name", None), PARSE, "'name'"),
    ("node-inputs-str", edited("nodes.0.inputs", "x"), PARSE, "'inputs'"),
    ("node-input-int", edited("nodes.0.inputs.0", 5), PARSE, "inputs entry 5"),
    ("node-outputs-none", edited("nodes.0.outputs", None), PARSE, "'outputs'"),
    ("node-attrs-list", edited("nodes.0.attrs", [1]), PARSE, "'attrs'"),
    ("node-attr-map", edited("nodes.0.attrs", {"a": {"b": 1}}), PARSE, "attr 'a'"),
    ("node-attr-too-deep", edited("nodes.0.attrs", {"a": [[[[1]]]]}), PARSE, "attr 'a'"),
    ("node-attr-unknown", edited("nodes.0.attrs", {"shell": "rm -rf /"}), PARSE, "node 'mm'"),
    ("weights-map", edited("weights", {}), PARSE, "'weights'"),
    ("weight-name-int", edited("weights.0.name", 1), PARSE, "'name'"),
    ("weight-dtype-bad", edited("weights.0.dtype", "object"), PARSE, "dtype 'object'"),
    ("weight-shape-none", edited("weights.0.shape", None), PARSE, "'shape'"),
    ("weight-data-str", edited("weights.0.data", "AAAA"), PARSE, "'data'"),
    ("weight-data-short", edited("weights.0.data", b"\0" * 60), PARSE, "weight 'w'"),
    ("dynamic-list", edited("dynamic", [1, 2]), PARSE, "'dynamic'"),
    ("batch-sizes-str", edited("dynamic", {"batch_sizes": "x"}), PARSE, "'batch_sizes'"),
    ("batch-size-zero", edited("dynamic", {"batch_sizes": [0]}), PARSE, "batch size 0"),
    ("batch-size-nan", edited("dynamic", {"batch_sizes": [float("nan")]}), PARSE, "batch size nan"),
]


def round_trip(rt) -> None:
    """The card still serves: malloc + memcpy there and back on the same device."""
    data = np.arange(1024, dtype=np.uint8)
    ptr = rt.malloc(data.nbytes)
    try:
        rt.memcpy(ptr, data.nbytes, data, data.nbytes, rt.ACL_MEMCPY_HOST_TO_DEVICE)
        back = np.zeros_like(data)
        rt.memcpy(back, back.nbytes, ptr, data.nbytes, rt.ACL_MEMCPY_DEVICE_TO_HOST)
    finally:
        rt.free(ptr)
    np.testing.assert_array_equal(back, data)


def refused(code: int, text: str, fn, *args) -> str:
    with pytest.raises(AclError) as info:
        fn(*args)
    assert info.value.code == code, info.value
    assert text in info.value.message, info.value.message
    return info.value.message


@pytest.mark.parametrize("data, code, text", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_model_is_refused_and_the_card_keeps_serving(dev0, data, code, text):
    refused(code, text, dev0.mdl.load_from_mem, data)
    round_trip(dev0)


@pytest.mark.parametrize("data, code, text", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_card_refuses_hostile_bytes_itself(dev0, data, code, text):
    """The host parse is only a fast path: the card judges the bytes on its own (any process may send them)."""
    refused(code, text, devices.current_card().call, "model_load", data)
    round_trip(dev0)


# Sizes a host cannot judge: fine on some card, more than this one's 2 GiB of HBM.
CARD_CASES = [
    ("input-over-hbm", graph([("x", [1 << 16, 1 << 14])], [("Relu", "r", ["x"], ["y"])], [("y", [1 << 16, 1 << 14])]),
     "input 'x'"),
    ("output-over-hbm", graph([("x", [1 << 15, 1])], [("Transpose", "t", ["x"], ["xt"]),
                                                       ("Add", "add", ["x", "xt"], ["y"])],
                              [("y", [1 << 15, 1 << 15])]), "output 'y'"),
    ("intermediate-over-hbm", graph([("a", [1, 1 << 15]), ("b", [1 << 15, 1])],
                                    [("Add", "add", ["a", "b"], ["s"]), ("ReduceSum", "sum", ["s"], ["t"])],
                                    [("t", [1, 1])]), "node 'add' output 's'"),
    ("dynamic-batch-gear-over-hbm", msgpack.packb({**msgpack.unpackb(
        graph([("x", [-1, 1 << 20])], [("Relu", "r", ["x"], ["y"])], [("y", [-1, 1 << 20])])),
        "dynamic": {"batch_sizes": [1, 1 << 10]}}), "input 'x'"),
]


@pytest.mark.parametrize("data, text", [c[1:] for c in CARD_CASES], ids=[c[0] for c in CARD_CASES])
def test_tensors_larger_than_the_card_are_refused_at_load(dev0, data, text):
    fmt.parse(data)  # a valid model: only the card knows it cannot hold it
    message = refused(PARSE, text, dev0.mdl.load_from_mem, data)
    assert "more than the card's 2 GiB" in message
    round_trip(dev0)


def _case(cases, name):
    return next(c for c in cases if c[0] == name)


def test_max_size_chain_is_accepted_and_runs(dev0):
    """The node cap is a real model's size, not a trap: the longest accepted chain loads and executes."""
    rt = dev0
    model_id = rt.mdl.load_from_mem(chain(limits.MAX_NODES))
    try:
        x = np.array([-1.0, 2.0, -3.0, 4.0], np.float32)
        ptrs = [rt.malloc(16), rt.malloc(16)]
        rt.memcpy(ptrs[0], 16, x, 16, rt.ACL_MEMCPY_HOST_TO_DEVICE)
        ins, outs = rt.mdl.create_dataset(), rt.mdl.create_dataset()
        rt.mdl.add_dataset_buffer(ins, rt.mdl.create_data_buffer(ptrs[0], 16))
        rt.mdl.add_dataset_buffer(outs, rt.mdl.create_data_buffer(ptrs[1], 16))
        rt.mdl.execute(model_id, ins, outs)
        y = np.zeros(4, np.float32)
        rt.memcpy(y, 16, ptrs[1], 16, rt.ACL_MEMCPY_DEVICE_TO_HOST)
        np.testing.assert_array_equal(y, np.maximum(x, 0))
        for p in ptrs:
            rt.free(p)
    finally:
        rt.mdl.unload(model_id)


def test_dynamic_dims_too_large_for_the_card_fail_the_execution_not_the_card(dev0):
    """Unbounded dims are chosen per execution: an intermediate past the card's HBM fails that execution."""
    rt = dev0
    data = graph([("a", [1, -1]), ("b", [-1, 1])], [("Add", "add", ["a", "b"], ["s"]), ("ReduceSum", "sum", ["s"], ["t"])],
                 [("t", [1, 1])])
    model_id = rt.mdl.load_from_mem(data)
    n = 1 << 15  # s is n x n float32: 4 GiB
    try:
        ptrs = [rt.malloc(4 * n), rt.malloc(4 * n), rt.malloc(4)]
        ins, outs = rt.mdl.create_dataset(), rt.mdl.create_dataset()
        for p in ptrs[:2]:
            rt.mdl.add_dataset_buffer(ins, rt.mdl.create_data_buffer(p, 4 * n))
        rt.mdl.add_dataset_buffer(outs, rt.mdl.create_data_buffer(ptrs[2], 4))
        rt.mdl.set_input_dynamic_dims(model_id, ins, 0, [1, n])
        rt.mdl.set_input_dynamic_dims(model_id, ins, 1, [n, 1])
        refused(207001, "node 'add'", rt.mdl.execute, model_id, ins, outs)
        for p in ptrs:
            rt.free(p)
    finally:
        rt.mdl.unload(model_id)
    round_trip(rt)


@pytest.mark.ray
@pytest.mark.timeout(120, method="signal")
def test_a_card_actor_refuses_hostile_models_and_keeps_serving(ray_rt):
    """Issue #21 item 1: on a real card actor, the huge-dims model killed the card ('card 0 is gone')."""
    rt = ray_rt
    rt.set_device(0)
    card = devices.current_card()
    for name in ("io-huge", "nodes-over-cap", "item-bomb", "cycle"):
        _, data, code, text = _case(CASES, name)
        refused(code, text, card.call, "model_load", data)  # straight to the card, no host parse
        round_trip(rt)
    _, data, text = _case(CARD_CASES, "intermediate-over-hbm")
    refused(PARSE, text, rt.mdl.load_from_mem, data)
    round_trip(rt)
