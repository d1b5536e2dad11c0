"""Fuzzing the model loader: whatever the bytes, parse() returns a valid model or raises a
parse-class AclError — never another exception, never a large allocation."""

import copy
import tracemalloc

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rt.errors import AclError
from rt.mdl import format as fmt
from rt.mdl.builder import GraphBuilder

PARSE_CLASS = {100003, 100012, 100013}
# Python objects for a parsed structure cost tens of bytes per input byte; a hostile header
# claiming far more than the input holds must not cost more than that.
PEAK_BASE, PEAK_PER_BYTE = 1 << 20, 40
FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def small_model() -> bytes:
    rng = np.random.default_rng(7)
    g = GraphBuilder("fuzz")
    x = g.input("x", "float32", [-1, 8])
    h = g.op("Relu", [g.op("Gemm", [x, g.constant("w", rng.standard_normal((8, 8), np.float32)),
                                    g.constant("b", np.zeros(8, np.float32))], transB=1)])
    y, _, _ = g.op("LayerNormalization", [h, g.constant("s", np.ones(8, np.float32))], axis=-1)
    g.output("y", g.op("Softmax", [y], axis=1))
    g.set_dynamic_batch([1, 4])
    return g.serialize()


VALID = small_model()
DOC = msgpack.unpackb(VALID, raw=False)


def check(data):
    """Parse under tracemalloc; assert the outcome class and the allocation bound."""
    tracemalloc.start()  # only around parse: tracing hypothesis itself would be slow
    try:
        model = fmt.parse(data)
    except AclError as exc:
        assert exc.code in PARSE_CLASS, exc
        model = None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    limit = PEAK_BASE + PEAK_PER_BYTE * len(data)
    assert peak < limit, f"parse allocated {peak} bytes for a {len(data)}-byte input (limit {limit})"
    if model is not None:  # anything accepted is a coherent model
        assert fmt.parse(fmt.serialize(model)) == model
    return model


def test_the_seed_model_is_valid():
    assert check(VALID) is not None


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8),
       st.integers(0, len(VALID)))
def test_byte_flips_and_truncations(flips, cut):
    data = bytearray(VALID)
    for pos, value in flips:
        data[pos] = value
    check(bytes(data[:cut]) if cut else bytes(data))


@FUZZ
@given(st.integers(0, len(VALID)), st.binary(min_size=1, max_size=16))
def test_insertions(pos, junk):
    check(VALID[:pos] + junk + VALID[pos:])


def _paths(value, path=()):
    """Every (path to a container slot) in the seed document."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return
    for key, child in items:
        yield path + (key,)
        yield from _paths(child, path + (key,))


PATHS = list(_paths(DOC))
SCALARS = (st.none() | st.booleans() | st.integers(-(2 ** 63), 2 ** 64 - 1) | st.floats(allow_nan=True)
           | st.text(max_size=12) | st.binary(max_size=12) | st.sampled_from(["float32", "bfloat16", "x", "Relu", "w"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8) | st.sampled_from(["name", "shape", "dtype", "data"]),
                                        inner, max_size=4), max_leaves=12)


def _replace(doc, path, value):
    doc = copy.deepcopy(doc)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(PATHS), VALUES), min_size=1, max_size=3))
def test_structural_mutations(edits):
    doc = DOC
    for path, value in edits:
        try:
            doc = _replace(doc, path, value)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed this slot
    check(msgpack.packb(doc, use_bin_type=True))


@settings(max_examples=60, deadline=None, database=None)
@given(VALUES)
def test_arbitrary_documents(value):
    check(msgpack.packb(value, use_bin_type=True))
    if isinstance(value, dict):
        check(msgpack.packb({**value, "format": "npusim-om", "version": 1}, use_bin_type=True))


def _with(field_bytes: bytes, key: str) -> bytes:
    """A valid document whose ``key`` entry is replaced by raw (hostile) msgpack bytes."""
    head = {k: v for k, v in DOC.items() if k != key}
    body = msgpack.packb(head, use_bin_type=True)
    assert body[0] & 0xF0 == 0x80  # fixmap: bump its count and append the raw entry
    return bytes([body[0] + 1]) + body[1:] + msgpack.packb(key) + field_bytes


def _weight_claiming(shape, data=b"\0" * 16) -> bytes:
    doc = dict(DOC, weights=[dict(DOC["weights"][0], shape=shape, data=data)] + DOC["weights"][1:])
    return msgpack.packb(doc, use_bin_type=True)


HOSTILE = {
    "weight claiming 2**40 elements": _weight_claiming([2 ** 20, 2 ** 20]),
    "weight of rank 32 huge dims": _weight_claiming([2 ** 31 - 1] * 32),  # exact-int product, no overflow
    "bin32 claiming 4 GiB": _with(b"\xc6\xff\xff\xff\xff" + b"\0" * 8, "weights"),
    "str32 claiming 4 GiB": _with(b"\xdb\xff\xff\xff\xff" + b"a" * 8, "name"),
    "array32 of 10**9 nodes": _with(b"\xdd" + (10 ** 9).to_bytes(4, "big") + b"\xc0" * 8, "nodes"),
    "map32 of 10**9 entries": _with(b"\xdf" + (10 ** 9).to_bytes(4, "big"), "weights"),
    "array32 of 10**9 gears": _with(b"\xdd" + (10 ** 9).to_bytes(4, "big") + b"\x01" * 64, "dynamic"),
    "bare array32 of 10**9": b"\xdd" + (10 ** 9).to_bytes(4, "big"),
    "100k nested arrays": b"\x91" * 100_000 + b"\xc0",
    "50k nested maps": b"\x81\xa1a" * 50_000 + b"\xc0",
    "30k-dim input": msgpack.packb(dict(DOC, inputs=[{"name": "x", "dtype": "float32", "shape": [1] * 30_000}])),
    "5000-node dangling chain": msgpack.packb(dict(DOC, nodes=[
        {"op": "Relu", "name": f"n{i}", "inputs": [f"v{i}"], "outputs": [f"v{i + 1}"]} for i in range(5000)])),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_documents(name):
    assert check(HOSTILE[name]) is None
