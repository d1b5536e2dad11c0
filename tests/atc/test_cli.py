"""The atc command line: ATC's flag checks, E-codes and exit status, --singleop models (run on a card, checked
with numpy), --mode=1 JSON, refusals naming the op. Most tests need neither onnx nor torch; those reading an
ONNX file skip without the onnx package."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import atc_helpers as h

SOC = "Ascend910B1"
FAILED = "ATC run failed, Please check the detail log, Try 'atc --help' for more information"


def failed_with(status, out, code):
    assert status == 255, out
    lines = out.splitlines()
    assert lines[:2] == ["ATC start working now, please wait for a moment.", FAILED], out
    assert lines[2].startswith(f"{code}: "), out
    return lines[2]


@pytest.fixture
def dummy(tmp_path):
    """A model file the flag checks see exist (they fail before it is read)."""
    path = tmp_path / "m.onnx"
    path.write_bytes(b"not read")
    return path


def base(dummy, tmp_path):
    return [f"--model={dummy}", "--framework=5", f"--output={tmp_path / 'out'}", f"--soc_version={SOC}"]


@pytest.mark.parametrize("flags, code, text", [
    (["--soc_version="], "E10054", "The required parameter [--soc_version] for ATC is empty"),
    (["--soc_version=Ascend310P3"], "E10001", "Value [Ascend310P3] for parameter [--soc_version] is invalid"),
    (["--framework="], "E10007", "[--framework] is required"),
    (["--framework=3"], "E10001", "Reason: npusim's atc converts ONNX models only"),
    (["--log=verbose"], "E10010", "Value [verbose] for parameter [--log] is invalid."),
    (["--dynamic_batch_size=1,2", "--dynamic_image_size=224,224;448,448"], "E10009", "mutually exclusive"),
    (["--input_shape=x:-1,3", "--dynamic_batch_size=4"], "E10035", "has [1] profiles, which is less than the minimum [2]"),
    (["--input_shape=x:-1,3", "--dynamic_batch_size=1,2,2"], "E10039", "duplicate profiles"),
    (["--input_shape=x:-1,3", "--dynamic_batch_size=0,2"], "E10038", "Dimension size [0] is invalid"),
    (["--input_shape=x:1,3", "--dynamic_batch_size=1,2"], "E10040", "must have -1 axes"),
    (["--input_shape=x:1,-1;y:-1,2", "--dynamic_batch_size=1,2"], "E10018", "only batch size N can be -1"),
    (["--input_shape=x:1,3,-1,-1", "--dynamic_image_size=224,224;448"], "E10020", "parameter [--dynamic_image_size] is invalid."),
    (["--input_shape=x:1,-1,-1,3", "--dynamic_image_size=2,2;4,4"], "E10019", "only the height and width axes"),
    (["--input_shape=x:-1,-1", "--dynamic_dims=1;2"], "E10046", "is greater than the dimension count per profile"),
    (["--input_shape=x:-1,3", "--dynamic_dims=1,2;2,3"], "E10001", "each profile has 2 dims but --input_shape has 1"),
    (["--input_shape=x:1,a"], "E10002", "Value [x:1,a] for parameter [--input_shape] is invalid"),
    (["--input_shape=x:1,-3"], "E10011", "The error value in the shape is [-3]"),
    (["--input_shape=x:1~8,3"], "E10001", "shape ranges (n1~n2) are not supported"),
    (["--output_type=FP64"], "E10001", "Value [FP64] for parameter [--output_type] is invalid"),
    (["--out_nodes=conv1"], "E10001", "Value [conv1] for parameter [--out_nodes] is invalid"),
    (["--input_format=NHWC"], "E10001", "The value must be NCHW, ND or NCDHW in ONNX model."),
    (["--mode=5"], "E10001", "Value [5] for parameter [--mode] is invalid"),
    (["--insert_op_conf=aipp.cfg"], "E10001", "Value [aipp.cfg] for parameter [--insert_op_conf] is invalid"),
    (["--precision_mode=fast"], "E10001", "Value [fast] for parameter [--precision_mode] is invalid"),
])
def test_flag_errors_use_atc_codes(atc, dummy, tmp_path, flags, code, text):
    line = failed_with(*atc(*base(dummy, tmp_path), *flags), code)
    assert text in line
    assert not (tmp_path / "out.om").exists()


def test_missing_model_file_and_unknown_flag(atc, tmp_path):
    line = failed_with(*atc(f"--model={tmp_path / 'nope.onnx'}", "--framework=5", f"--output={tmp_path / 'o'}",
                            f"--soc_version={SOC}"), "E10001")
    assert "parameter [--model]" in line
    status, out = atc("--model=m.onnx", "--fast_mode=1")
    assert status == 255 and out.splitlines()[1:] == [FAILED, "ERROR: unknown command line flag 'fast_mode'"]


def test_help_lists_the_flags(atc):
    status, out = atc("--help")
    assert status == 0
    for flag in ("--model", "--framework", "--output", "--soc_version", "--input_shape", "--dynamic_batch_size",
                 "--dynamic_image_size", "--dynamic_dims", "--output_type", "--input_fp16_nodes", "--out_nodes",
                 "--singleop", "--mode", SOC):
        assert flag in out


def test_without_the_onnx_package_atc_names_the_extra(atc, dummy, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)          # import onnx -> ImportError
    line = failed_with(*atc(*base(dummy, tmp_path)), "E10041")
    assert 'pip install "npusim[atc]"' in line


# ------------------------------------------------------------------------------------------- ONNX inputs

def _onnx_model(path, nodes, inputs, outputs, initializers=()):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                              list(initializers))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_unsupported_op_is_refused_naming_node_and_type(atc, tmp_path):
    from rt.kernels.registry import REGISTRY
    assert "Det" not in REGISTRY
    pytest.importorskip("onnx")
    from onnx import helper
    path = _onnx_model(tmp_path / "det.onnx", [helper.make_node("Relu", ["x"], ["r"], name="relu0"),
                                               helper.make_node("Det", ["r"], ["y"], name="my_det")],
                       [("x", [2, 3, 3])], ["y"])
    line = failed_with(*atc(f"--model={path}", "--framework=5", f"--output={tmp_path / 'det'}",
                            f"--soc_version={SOC}"), "E19010")
    assert line == "E19010: No parser is registered for Op [my_det, optype [ai.onnx::17::Det]]."
    assert not (tmp_path / "det.om").exists()


def test_garbage_onnx_and_unknown_input_name(atc, tmp_path, dummy):
    pytest.importorskip("onnx")
    failed_with(*atc(*base(dummy, tmp_path)), "E10041")
    from onnx import helper
    path = _onnx_model(tmp_path / "relu.onnx", [helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", [2, 3])],
                       ["y"])
    line = failed_with(*atc(f"--model={path}", "--framework=5", f"--output={tmp_path / 'o'}", f"--soc_version={SOC}",
                            "--input_shape=image:1,3"), "E10016")
    assert "Opname [image] specified in [--input_shape] is not found" in line


def test_a_parameter_input_computed_on_the_card_is_refused(atc, tmp_path):
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Relu", ["shape_f"], ["s"], name="relu_shape"),
             helper.make_node("Cast", ["s"], ["shape"], name="to_int", to=TensorProto.INT64),
             helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape0")]
    path = _onnx_model(tmp_path / "r.onnx", nodes, [("x", [2, 6]), ("shape_f", [2])], ["y"])
    line = failed_with(*atc(f"--model={path}", "--framework=5", f"--output={tmp_path / 'o'}", f"--soc_version={SOC}"),
                       "E13014")
    assert "parameter [shape] for Op [reshape0]" in line


def test_mode_1_dumps_a_model_as_json(atc, tmp_path):
    from rt.mdl import GraphBuilder
    g = GraphBuilder("mlp")
    x = g.input("x", "float32", [2, 4])
    g.output("y", g.op("Relu", [g.op("MatMul", [x, g.constant("w", np.ones((4, 3), np.float32))])]))
    g.save(str(tmp_path / "mlp.om"))
    status, out = atc("--mode=1", f"--om={tmp_path / 'mlp.om'}", f"--json={tmp_path / 'mlp.json'}")
    assert status == 0, out
    doc = json.loads((tmp_path / "mlp.json").read_text())
    assert doc["format"] == "npusim-om" and [n["op"] for n in doc["nodes"]] == ["MatMul", "Relu"]
    assert doc["weights"] == [{"name": "w", "dtype": "float32", "shape": [4, 3], "nbytes": 48}]


# ------------------------------------------------------------------------------------------- --singleop

OPS = [
    {"op": "Add", "input_desc": [{"format": "ND", "shape": [8, 16], "type": "float16"},
                                 {"format": "ND", "shape": [8, 16], "type": "float16"}],
     "output_desc": [{"format": "ND", "shape": [8, 16], "type": "float16"}]},
    {"op": "MatMul", "input_desc": [{"format": "ND", "shape": [4, 8], "type": "float"},
                                    {"format": "ND", "shape": [8, 3], "type": "float"}],
     "output_desc": [{"format": "ND", "shape": [4, 3], "type": "float"}]},
    {"op": "Cast", "input_desc": [{"format": "ND", "shape": [5], "type": "float32"}],
     "output_desc": [{"format": "ND", "shape": [5], "type": "fp16"}],
     "attr": [{"name": "to", "type": "data_type", "value": "DT_FLOAT16"}]},
    {"op": "Cast", "input_desc": [{"format": "ND", "shape": [5], "type": "float32"}],       # CANN's spelling
     "output_desc": [{"format": "ND", "shape": [5], "type": "int32"}],
     "attr": [{"name": "dst_type", "type": "int", "value": 3}]},
    {"op": "RealDiv", "input_desc": [{"format": "NCHW", "shape": [1, 2, 2, 2], "type": "float"}] * 2,
     "output_desc": [{"format": "NCHW", "shape": [1, 2, 2, 2], "type": "float"}]},
]


def test_singleop_models_are_named_as_atc_names_them_and_run(atc, tmp_path, rt_local):
    (tmp_path / "ops.json").write_text(json.dumps(OPS))
    status, out = atc(f"--singleop={tmp_path / 'ops.json'}", f"--output={tmp_path / 'op_models'}",
                      f"--soc_version={SOC}")
    assert status == 0, out
    names = sorted(p.name for p in (tmp_path / "op_models").iterdir())
    assert names == ["0_Add_1_2_8_16_1_2_8_16_1_2_8_16.om", "1_MatMul_0_2_4_8_0_2_8_3_0_2_4_3.om",
                     "2_Cast_0_2_5_1_2_5.om", "3_Cast_0_2_5_3_2_5.om",
                     "4_RealDiv_0_0_1_2_2_2_0_0_1_2_2_2_0_0_1_2_2_2.om"]
    from rt.mdl import format as fmt
    for name in names:
        model = fmt.parse((tmp_path / "op_models" / name).read_bytes())
        assert len(model.nodes) == 1
    rng = np.random.default_rng(0)
    rt_local.set_device(0)
    a, b = rng.standard_normal((2, 8, 16)).astype(np.float16)
    (got,) = h.on_card(rt_local, tmp_path / "op_models" / names[0], [a, b])
    np.testing.assert_array_equal(got, a + b)
    a, b = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)
    (got,) = h.on_card(rt_local, tmp_path / "op_models" / names[1], [a, b])
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-6)
    x = rng.standard_normal(5).astype(np.float32)
    (got,) = h.on_card(rt_local, tmp_path / "op_models" / names[2], [x])
    np.testing.assert_array_equal(got, x.astype(np.float16))
    x = (rng.standard_normal(5) * 10).astype(np.float32)
    (got,) = h.on_card(rt_local, tmp_path / "op_models" / names[3], [x])
    np.testing.assert_array_equal(got, x.astype(np.int32))
    a, b = rng.standard_normal((2, 1, 2, 2, 2)).astype(np.float32)
    (got,) = h.on_card(rt_local, tmp_path / "op_models" / names[4], [a, b + 3])
    np.testing.assert_allclose(got, a / (b + 3), rtol=1e-6)


@pytest.mark.parametrize("ops, code", [
    (None, "E10023"),
    ("{not json", "E10025"),
    ([{"input_desc": []}], "E10026"),
    ([{"op": "Add", "input_desc": [{"format": "NC1HWC0", "shape": [1], "type": "float"}] * 2}], "E10027"),
    ([{"op": "Add", "input_desc": [{"format": "ND", "shape": [1], "type": "string"}] * 2}], "E10027"),
    ([{"op": "Cast", "input_desc": [{"format": "ND", "shape": [1], "type": "float"}], "attr": [{"type": "int"}]}],
     "E10029"),
    ([{"op": "Cast", "input_desc": [{"format": "ND", "shape": [1], "type": "float"}],
       "attr": [{"name": "to", "type": "data_type", "value": "DT_NOPE"}]}], "E10030"),
    ([{"op": "TransData", "input_desc": [{"format": "ND", "shape": [1], "type": "float"}]}], "E10501"),
    ([{"op": "Add", "input_desc": [{"format": "ND", "shape": [2], "type": "float"}] * 2,
       "output_desc": [{"format": "ND", "shape": [3], "type": "float"}]}], "E10055"),
])
def test_singleop_errors(atc, tmp_path, ops, code):
    path = tmp_path / "ops.json"
    if ops is not None:
        path.write_text(ops if isinstance(ops, str) else json.dumps(ops))
    failed_with(*atc(f"--singleop={path}", f"--output={tmp_path / 'out'}", f"--soc_version={SOC}"), code)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------- format gears

@pytest.mark.parametrize("key, profiles", [("image_sizes", ((224, 224), (448, 448))), ("dims", ((2, 16), (4, 32)))])
def test_dims_gears_round_trip_through_the_file(key, profiles):
    """--dynamic_image_size / --dynamic_dims gears are kept in the model file (format ``dynamic`` map)."""
    import dataclasses

    from rt.mdl import GraphBuilder
    from rt.mdl import format as fmt
    g = GraphBuilder("m")
    shape = [1, 3, -1, -1] if key == "image_sizes" else [-1, -1]
    g.output("y", g.op("Relu", [g.input("x", "float32", shape)]))
    model = dataclasses.replace(g.build(), **{key: profiles})
    assert getattr(fmt.parse(fmt.serialize(model)), key) == profiles


@pytest.mark.parametrize("dynamic, text", [
    ({"image_sizes": [[224, 224]], "dims": [[1, 1]]}, "exactly one of"),
    ({"image_sizes": [[224]]}, "is not a list of 2 ints"),
    ({"dims": [[1, 2], [1, 2]]}, "duplicate profiles"),
    ({"dims": [[1, 2, 3]]}, "is not a list of 2 ints"),
])
def test_bad_dims_gears_are_refused_by_the_parser(dynamic, text):
    import msgpack

    from rt.errors import AclError
    from rt.mdl import GraphBuilder
    from rt.mdl import format as fmt
    g = GraphBuilder("m")
    g.output("y", g.op("Relu", [g.input("x", "float32", [1, 3, -1, -1])]))
    doc = fmt.to_document(g.build())
    doc["dynamic"] = dynamic
    with pytest.raises(AclError) as e:
        fmt.parse(msgpack.packb(doc, use_bin_type=True))
    assert e.value.code == 100013 and text in e.value.message


def test_a_real_atc_om_is_refused_pointing_at_npusims_atc():
    """A CANN .om (magic IMOD) cannot run on the simulated card: the loader says to convert the ONNX with atc."""
    import struct

    from rt.errors import AclError
    from rt.mdl import format as fmt
    header = b"IMOD" + struct.pack("<I", 1) + bytes(248)
    with pytest.raises(AclError) as e:
        fmt.parse(header)
    assert e.value.code == 100013
    assert "npusim's atc" in e.value.message and "--framework=5" in e.value.message and "docs/atc.md" in e.value.message


def test_the_python_api_refuses_wrong_arguments_with_atc_codes():
    from rt.mdl.onnx import AtcError, convert, parse_options
    for call in (lambda: convert(3), lambda: convert("m.onnx", {"input_shape": "x:1"}),
                 lambda: parse_options(input_shape=5), lambda: parse_options(dynamic_batch_size=[1, 2])):
        with pytest.raises(AtcError) as e:
            call()
        assert e.value.code == "E10001"


def test_folding_refuses_absurd_constants():
    from rt.mdl.onnx import fold
    with pytest.raises(ValueError, match="over"):
        fold.fold("ConstantOfShape", [np.array([1 << 20, 1 << 20])], {})
    with pytest.raises(ValueError, match="over"):
        fold.fold("Tile", [np.ones((1 << 10, 1 << 10)), np.array([1 << 10, 1])], {})
    assert fold.fold("Range", [np.array(0), np.array(5), np.array(2)], {})[0].tolist() == [0, 2, 4]


def test_an_input_without_shape_needs_input_shape(atc, tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "noshape.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    flags = [f"--model={path}", "--framework=5", f"--output={tmp_path / 'o'}", f"--soc_version={SOC}"]
    line = failed_with(*atc(*flags), "E11005")
    assert "input [x]" in line
    status, out = atc(*flags, "--input_shape=x:2,3")
    assert status == 0, out
    from rt.mdl import format as fmt
    assert fmt.parse((tmp_path / "o.om").read_bytes()).inputs[0].shape == (2, 3)


def test_mode_1_shows_an_onnx_graph_as_json(atc, tmp_path):
    pytest.importorskip("onnx")
    from onnx import helper
    path = _onnx_model(tmp_path / "relu.onnx", [helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", [2, 3])],
                       ["y"])
    status, out = atc("--mode=1", "--framework=5", f"--om={path}", f"--json={tmp_path / 'g.json'}")
    assert status == 0, out
    doc = json.loads((tmp_path / "g.json").read_text())
    assert [n["opType"] for n in doc["graph"]["node"]] == ["Relu"]
    failed_with(*atc("--mode=1", "--framework=3", f"--om={path}", f"--json={tmp_path / 'g.json'}"), "E10001")


def test_a_slice_bound_from_a_dynamic_dim_is_refused_not_misread(atc, tmp_path):
    """x[:, :n] with n = x.shape[0] unknown: the folded -1 must not become Slice's "end = -1"."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    zero = helper.make_tensor("zero", TensorProto.INT64, [1], [0])
    one = helper.make_tensor("one", TensorProto.INT64, [1], [1])
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Slice", ["s", "zero", "one"], ["n"], name="dim0"),
             helper.make_node("Slice", ["x", "zero", "n", "one"], ["y"], name="cut")]
    path = _onnx_model(tmp_path / "cut.onnx", nodes, [("x", ["batch", 8])], ["y"], [zero, one])
    line = failed_with(*atc(f"--model={path}", "--framework=5", f"--output={tmp_path / 'o'}", f"--soc_version={SOC}"),
                       "E13014")
    assert "parameter [ends] for Op [cut]" in line
    status, out = atc(f"--model={path}", "--framework=5", f"--output={tmp_path / 'o'}", f"--soc_version={SOC}",
                      "--input_shape=x:4,8")
    assert status == 0, out


def test_singleop_models_run_through_acl_op_execute_v2(atc, tmp_path, acl0):
    """The pyACL single-operator sequence over atc's op models: set_model_dir, tensor descs, execute_v2."""
    acl = acl0
    (tmp_path / "ops.json").write_text(json.dumps(OPS[:1]))
    status, out = atc(f"--singleop={tmp_path / 'ops.json'}", f"--output={tmp_path / 'op_models'}",
                      f"--soc_version={SOC}")
    assert status == 0, out
    assert acl.op.set_model_dir(str(tmp_path / "op_models")) == 0
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 8, 16)).astype(np.float16)
    descs = [acl.create_tensor_desc(1, [8, 16], 2) for _ in range(3)]          # ACL_FLOAT16, ACL_FORMAT_ND
    bufs, ptrs = [], []
    for host in (a, b, np.zeros_like(a)):
        ptr, ret = acl.rt.malloc(host.nbytes, 0)
        assert ret == 0 and acl.rt.memcpy(ptr, host.nbytes, acl.util.numpy_to_ptr(host), host.nbytes, 1) == 0
        ptrs.append(ptr)
        bufs.append(acl.create_data_buffer(ptr, host.nbytes))
    stream, ret = acl.rt.create_stream()
    attr = acl.op.create_attr()
    assert acl.op.execute_v2("Add", descs[:2], bufs[:2], descs[2:], bufs[2:], attr, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    got = np.empty_like(a)
    assert acl.rt.memcpy(acl.util.numpy_to_ptr(got), got.nbytes, ptrs[2], got.nbytes, 2) == 0
    np.testing.assert_array_equal(got, a + b)
