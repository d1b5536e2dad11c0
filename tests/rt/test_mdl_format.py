"""The npusim-om format: round trip, GraphBuilder inference errors, and every loader rejection."""

import msgpack
import numpy as np
import pytest

from rt.errors import AclError
from rt.mdl import format as fmt
from rt.mdl.builder import GraphBuilder

INVALID_FILE, DESERIALIZE, PARSE = 100003, 100012, 100013


def mlp_bytes(dynamic=True) -> bytes:
    rng = np.random.default_rng(0)
    g = GraphBuilder("mlp")
    x = g.input("x", "float32", [-1 if dynamic else 4, 8])
    h = g.op("Gemm", [x, g.constant("w1", rng.standard_normal((8, 16), np.float32)),
                      g.constant("b1", rng.standard_normal(16).astype(np.float32))])
    h = g.op("Relu", [h])
    y = g.op("Softmax", [g.op("MatMul", [h, g.constant("w2", rng.standard_normal((16, 3), np.float32))])], axis=-1)
    g.output("probs", y)
    if dynamic:
        g.set_dynamic_batch([1, 2, 4])
    return g.serialize()


def doc_of(data: bytes) -> dict:
    return msgpack.unpackb(data, raw=False)


def pack(doc) -> bytes:
    return msgpack.packb(doc, use_bin_type=True)


def rejected(data, code: int, *words: str) -> AclError:
    with pytest.raises(AclError) as info:
        fmt.parse(data)
    assert info.value.code == code, info.value
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    return info.value


def node_named(doc, name):
    return next(n for n in doc["nodes"] if n["name"] == name)


# ---------------------------------------------------------------------------------------------
# round trip


def test_round_trip_is_identical():
    data = mlp_bytes()
    model = fmt.parse(data)
    assert fmt.serialize(model) == data
    assert fmt.parse(fmt.serialize(model)) == model
    assert model.name == "mlp" and model.batch_sizes == (1, 2, 4)
    assert [v.name for v in model.inputs] == ["x"] and model.inputs[0].shape == (-1, 8)
    assert model.outputs[0].shape == (-1, 3) and model.outputs[0].dtype == np.float32
    assert [n.op for n in model.nodes] == ["Gemm", "Relu", "MatMul", "Softmax"]
    w1 = {w.name: w for w in model.weights}["w1"]
    assert w1.array().shape == (8, 16) and model.weight_bytes == 4 * (8 * 16 + 16 + 16 * 3)


def test_parse_sorts_nodes_topologically():
    doc = doc_of(mlp_bytes())
    doc["nodes"].reverse()
    model = fmt.parse(pack(doc))
    assert [n.op for n in model.nodes] == ["Gemm", "Relu", "MatMul", "Softmax"]


def test_weights_keep_dtype_and_values_including_bf16():
    g = GraphBuilder("w")
    a = np.arange(12, dtype=np.float32).reshape(3, 4).astype(fmt.DTYPES["bfloat16"])
    b = np.arange(4, dtype=">i4")  # big-endian input is stored little-endian
    x = g.input("x", "bfloat16", [2, 3])
    g.output("y", g.op("MatMul", [x, g.constant("a", a)]))
    g.output("b_out", g.constant("b", b))
    model = fmt.parse(g.serialize())
    weights = {w.name: w for w in model.weights}
    np.testing.assert_array_equal(weights["a"].array().astype(np.float32), a.astype(np.float32))
    assert weights["b"].dtype == np.int32 and list(weights["b"].array()) == [0, 1, 2, 3]
    assert [n.op for n in model.nodes] == ["MatMul", "Identity"]  # a weight exported via a copy


def test_save_and_read_model_file(tmp_path):
    g = GraphBuilder("saved")
    g.output("y", g.op("Relu", [g.input("x", "float32", [2])]))
    path = tmp_path / "m.om"
    g.save(path)
    assert fmt.parse(fmt.read_model_file(path)) == g.build()
    with pytest.raises(AclError) as info:
        fmt.read_model_file(tmp_path / "missing.om")
    assert info.value.code == 100014 and "missing.om" in str(info.value)


# ---------------------------------------------------------------------------------------------
# GraphBuilder


def test_builder_infers_shapes_and_names():
    g = GraphBuilder("b")
    x = g.input("x", "float32", [-1, 6])
    y = g.op("MatMul", [x, g.constant("w", np.ones((6, 5), np.float32))], name="mm")
    assert y.shape == (-1, 5) and y.dtype == np.float32 and y.name == "mm"
    parts = g.op("Split", [y], axis=1, split=[2, 3])
    assert isinstance(parts, tuple) and [p.shape for p in parts] == [(-1, 2), (-1, 3)]
    named = g.op("Relu", [parts[1]], outputs=["act"])
    assert named.name == "act"
    g.output("first", parts[0])
    g.output("act", named)
    g.output("x_again", x)  # an input exported under another name goes through Identity
    model = g.build()
    assert [v.name for v in model.outputs] == ["first", "act", "x_again"]
    assert model.outputs[0].shape == (-1, 2)


def test_builder_errors_are_the_ops_errors():
    g = GraphBuilder("bad")
    x = g.input("x", "float32", [2, 3])
    with pytest.raises(AclError) as info:
        g.op("MatMul", [x, g.constant("w", np.ones((4, 5), np.float32))])
    assert info.value.code == 100000 and "MatMul" in str(info.value)
    with pytest.raises(AclError) as info:
        g.op("Add", [x, g.constant("i", np.ones((2, 3), np.int32))])
    assert info.value.code == 100026
    with pytest.raises(AclError) as info:
        g.op("NoSuchOp", [x])
    assert info.value.code == 100024 and "NoSuchOp" in str(info.value)
    with pytest.raises(AclError) as info:
        g.op("Softmax", [x], axis=7)
    assert info.value.code == 100000


def test_builder_rejects_bad_names_and_usage():
    g = GraphBuilder("bad")
    x = g.input("x", "float32", [2, 3])
    for call in (lambda: g.input("x", "float32", [1]),
                 lambda: g.constant("x", np.ones(2)),
                 lambda: g.input("z", "float32", [-2]),
                 lambda: g.op("Relu", [x], outputs=["x"]),
                 lambda: g.op("Relu", [x], color=object()),
                 lambda: g.op("Relu", [GraphBuilder("other").input("q", "float32", [1])]),
                 lambda: g.set_dynamic_batch([0, 1]),
                 lambda: g.set_dynamic_batch([2, 2])):
        with pytest.raises(AclError) as info:
            call()
        assert info.value.code == 100000
    with pytest.raises(AclError) as info:
        g.input("s", "object", [1])
    assert info.value.code == 100026
    with pytest.raises(AclError) as info:
        g.build()
    assert "no outputs" in str(info.value)
    g.output("y", g.op("Relu", [x]))
    g.set_dynamic_batch([1, 2])  # but no input has a -1 batch dim
    with pytest.raises(AclError) as info:
        g.serialize()
    assert info.value.code == 100000 and "dim 0 is -1" in str(info.value)


def _graph_with_output():
    g = GraphBuilder("args")
    x = g.input("x", "float32", [2, 3])
    g.output("y", g.op("Relu", [x]))
    return g, x


@pytest.mark.parametrize("call, words", [
    (lambda g, x: g.input("a", "float32", 3), ["shape", "3"]),
    (lambda g, x: g.input("a", "float32", None), ["shape", "None"]),
    (lambda g, x: g.input("a", "float32", [2.5]), ["shape", "2.5"]),
    (lambda g, x: g.input("a", "float32", ["2"]), ["shape"]),
    (lambda g, x: g.input("a", "float32", [1] * 33), ["33 dims"]),
    (lambda g, x: g.input("a", "float32", [(1 << 31) - 1] * 4), ["input 'a'", "bytes"]),
    (lambda g, x: g.set_dynamic_batch("x"), ["batch_sizes", "'x'"]),
    (lambda g, x: g.set_dynamic_batch(None), ["batch_sizes", "None"]),
    (lambda g, x: g.set_dynamic_batch(float("nan")), ["batch_sizes", "nan"]),
    (lambda g, x: g.set_dynamic_batch([1, float("nan")]), ["batch_sizes", "nan"]),
    (lambda g, x: g.op(["Relu"], [x]), ["op_type", "['Relu']"]),
    (lambda g, x: g.op("Relu", 3), ["inputs", "3"]),
    (lambda g, x: g.op("Relu", None), ["inputs", "None"]),
    (lambda g, x: g.op("Relu", [x], outputs=3), ["outputs", "3"]),
    (lambda g, x: g.op("Relu", [x], name=["n"]), ["name", "['n']"]),
    (lambda g, x: g.op("Softmax", [x], axis=1 << 70), ["axis", "int64"]),
    (lambda g, x: g.save(None), ["path", "None"]),
    (lambda g, x: g.save(""), ["path"]),
])
def test_builder_argument_errors_name_the_argument(call, words):
    g, x = _graph_with_output()
    with pytest.raises(AclError) as info:
        call(g, x)
    assert info.value.code == 100000, info.value
    for word in words:
        assert word in info.value.message, (word, info.value.message)


def test_builder_refuses_a_graph_the_loader_would(monkeypatch):
    from rt.mdl import limits
    monkeypatch.setattr(limits, "MAX_NODES", 2)  # the real cap takes 32769 g.op calls to reach
    g, x = _graph_with_output()
    g.op("Relu", [g.op("Relu", [x])])
    with pytest.raises(AclError) as info:
        g.build()
    assert info.value.code == 100000 and "nodes has 3 entries, at most 2" in info.value.message


def test_builder_save_failures_are_write_file_errors(tmp_path):
    g, _ = _graph_with_output()
    for path in (tmp_path, tmp_path / "missing" / "m.om"):
        with pytest.raises(AclError) as info:
            g.save(path)
        assert info.value.code == 100004 and str(path) in info.value.message, info.value
    g.save(tmp_path / "m.om")  # and the builder still works
    assert fmt.parse((tmp_path / "m.om").read_bytes()).outputs[0].name == "y"


# ---------------------------------------------------------------------------------------------
# rejections


@pytest.mark.parametrize("data, code", [
    ("not bytes", INVALID_FILE),
    (b"", INVALID_FILE),
    (pack([1, 2, 3]), INVALID_FILE),
    (pack({"format": "onnx", "version": 1}), INVALID_FILE),
    (b"\xc1", DESERIALIZE),  # never-used msgpack byte
    (b"\x85\xa6format", DESERIALIZE),  # truncated
    (pack({1: "int key"}), DESERIALIZE),  # strict_map_key
    (pack({"format": "npusim-om"}) + b"\x00", DESERIALIZE),  # trailing bytes
    (msgpack.packb(msgpack.ExtType(1, b"xx")), DESERIALIZE),
])
def test_undecodable_or_foreign_bytes(data, code):
    rejected(data, code)


def mutate(fn, *words, code=PARSE):
    doc = doc_of(mlp_bytes())
    fn(doc)
    return rejected(pack(doc), code, *words)


def test_version_and_missing_or_mistyped_fields():
    mutate(lambda d: d.update(version=2), "version")
    mutate(lambda d: d.pop("nodes"), "nodes")
    mutate(lambda d: d.update(inputs="x"), "inputs")
    mutate(lambda d: d.update(outputs=[]), "no outputs")
    mutate(lambda d: d["inputs"][0].update(shape=["8", 8]), "inputs[0]", "shape")
    mutate(lambda d: d["inputs"][0].update(shape=[True, 8]), "inputs[0]")
    mutate(lambda d: d["inputs"][0].update(dtype="object"), "dtype")
    mutate(lambda d: d["inputs"][0].update(dtype="O"), "dtype")
    mutate(lambda d: d["inputs"][0].update(name=""), "name")
    mutate(lambda d: d["nodes"][0].update(inputs=[1]), "Gemm_0", "inputs entry 1")
    mutate(lambda d: d["nodes"][0].update(attrs={"a": b"bytes"}), "attr 'a'")
    mutate(lambda d: d["nodes"][0].update(attrs={"a": [[[[1]]]]}), "attr 'a'")
    mutate(lambda d: d["nodes"][0].update(attrs=[1]), "attrs")
    mutate(lambda d: d["weights"][0].update(data="text"), "weight 'w1'", "data")
    mutate(lambda d: d["weights"].append(7), "weights[3]")


def test_absurd_and_negative_dims():
    mutate(lambda d: d["inputs"][0].update(shape=[-2, 8]), "-2")
    mutate(lambda d: d["inputs"][0].update(shape=[2 ** 40, 8]), str(2 ** 40))
    mutate(lambda d: d["inputs"][0].update(shape=[1] * 33), "33 dims")
    mutate(lambda d: d["weights"][0].update(shape=[-1, 16]), "weight 'w1'")


def test_weight_bytes_must_match_dtype_times_shape():
    mutate(lambda d: d["weights"][0].update(data=d["weights"][0]["data"][:-1]), "weight 'w1'", "511")
    mutate(lambda d: d["weights"][0].update(data=d["weights"][0]["data"] + b"\0"), "weight 'w1'", "513")
    mutate(lambda d: d["weights"][0].update(dtype="float64"), "weight 'w1'", "1024")
    # a huge claim is refused by arithmetic, before anything is allocated
    mutate(lambda d: d["weights"][0].update(shape=[2 ** 31 - 1] * 4), "weight 'w1'")


def test_unknown_op_names_the_node():
    mutate(lambda d: d["nodes"][1].update(op="Frobnicate"), "Frobnicate", "node ")


def test_missing_weight_and_dangling_edges():
    mutate(lambda d: d["weights"].pop(0), "w1", "never produced")
    mutate(lambda d: d["nodes"][1].update(inputs=["ghost"]), "ghost", "never produced")
    mutate(lambda d: d["outputs"][0].update(name="nowhere"), "nowhere", "never produced")


def test_value_produced_twice_and_duplicate_node_names():
    mutate(lambda d: d["nodes"][1].update(outputs=[d["nodes"][0]["outputs"][0]]), "already produced")
    mutate(lambda d: d["nodes"][0].update(outputs=["x"]), "'x'", "already produced")
    mutate(lambda d: d["weights"][1].update(name="w1"), "'w1'", "already produced")
    mutate(lambda d: d["nodes"][1].update(name=d["nodes"][0]["name"]), "used twice")


def test_cycle_is_detected():
    def make_cycle(d):
        relu = next(n for n in d["nodes"] if n["op"] == "Relu")
        gemm = next(n for n in d["nodes"] if n["op"] == "Gemm")
        gemm["inputs"][0] = relu["outputs"][0]  # Gemm <- Relu <- Gemm
    mutate(make_cycle, "cycle")


def test_declared_outputs_must_match_inference():
    mutate(lambda d: d["outputs"][0].update(shape=[-1, 4]), "probs", "declared", "[-1, 3]")
    mutate(lambda d: d["outputs"][0].update(dtype="float16"), "probs", "float16")
    mutate(lambda d: d["inputs"][0].update(shape=[-1, 9]), "Gemm")  # contradicts the weight
    mutate(lambda d: d["nodes"][0].update(outputs=d["nodes"][0]["outputs"] + ["extra"]), "declares 2 outputs")
    mutate(lambda d: node_named(d, "Softmax_3")["attrs"].update(axis=5), "Softmax")
    mutate(lambda d: node_named(d, "Softmax_3")["attrs"].update(axis="five"), "Softmax")


def test_dynamic_batch_section():
    mutate(lambda d: d.update(dynamic={"batch_sizes": []}), "batch_sizes")
    mutate(lambda d: d.update(dynamic={"batch_sizes": [0, 2]}), "batch size 0")
    mutate(lambda d: d.update(dynamic={"batch_sizes": [2, 2]}), "duplicates")
    mutate(lambda d: d.update(dynamic={"batch_sizes": list(range(1, 200))}), "1..100")
    mutate(lambda d: d.update(dynamic=[1]), "dynamic")
    doc = doc_of(mlp_bytes(dynamic=False))
    doc["dynamic"] = {"batch_sizes": [1, 2]}
    rejected(pack(doc), PARSE, "dim 0 is -1")


def test_every_batch_gear_must_fit_the_graph():
    g = GraphBuilder("gears")
    g.output("y", g.op("Reshape", [g.input("x", "float32", [-1, 6])], shape=[2, 6]))
    g.set_dynamic_batch([2])
    doc = doc_of(g.serialize())  # batch 2 fits the fixed Reshape
    g.set_dynamic_batch([2, 4])
    with pytest.raises(AclError) as info:
        g.serialize()
    assert info.value.code == 100000 and "batch 4" in str(info.value)
    # a file claiming the gear anyway is refused when a card loads it (describe runs the largest gear)
    from rt.card.models import describe
    doc["dynamic"] = {"batch_sizes": [2, 4]}
    with pytest.raises(AclError) as info:
        describe(fmt.parse(pack(doc)))
    assert info.value.code == PARSE and "[[4, 6]]" in str(info.value)
