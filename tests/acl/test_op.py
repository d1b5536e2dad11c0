"""acl.op single-operator execution and the aclTensorDesc / aclopAttr functions, against pyACL's documented
forms and codes; results checked with numpy. Op models are npusim-om one-node models built with GraphBuilder,
named as ``atc --singleop`` names them."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rt.mdl import GraphBuilder

pytestmark = pytest.mark.timeout(120)
PROGRAMS = Path(__file__).resolve().parent / "programs"
ACL_FLOAT, ACL_FLOAT16, ACL_INT32, ACL_INT64 = 0, 1, 3, 9
ND, NCHW, NC1HWC0 = 2, 0, 3
OP_NOT_FOUND, OP_OUTPUT_NOT_MATCH, FORMAT_NOT_MATCH, READ_MODEL_FAILURE = 100024, 100022, 100027, 100014
INVALID = 100000


def op_model(op, inputs, outputs, **attrs):
    """A one-node model: ``inputs``/``outputs`` are (dtype, shape) pairs, in the op's order."""
    g = GraphBuilder(f"single_{op}")
    xs = [g.input(f"x{i}", dt, shape) for i, (dt, shape) in enumerate(inputs)]
    ys = g.op(op, xs, outputs=[f"y{i}" for i in range(len(outputs))], **attrs)
    for i, y in enumerate(ys if isinstance(ys, tuple) else (ys,)):
        g.output(f"y{i}", y)
    return g.serialize()


def atc_name(index, op, inputs, outputs):
    codes = {"float16": 1, "float32": 0, "int32": 3}
    parts = [f"{codes[dt]}_{ND}_" + "_".join(map(str, shape)) for dt, shape in inputs + outputs]
    return f"{index}_{op}_" + "_".join(parts) + ".om"


@pytest.fixture
def op_dir(tmp_path):
    add = [("float16", [8, 16])] * 2, [("float16", [8, 16])]
    (tmp_path / atc_name(0, "Add", *add)).write_bytes(op_model("Add", *add))
    sub = tmp_path / "nested"
    sub.mkdir()
    soft = [("float32", [4, 10])], [("float32", [4, 10])]
    (sub / atc_name(1, "Softmax", *soft)).write_bytes(op_model("Softmax", *soft, axis=1))
    (tmp_path / "notes.txt").write_text("not a model")
    return tmp_path


class Dev:
    """Device tensors for an op: descs, buffers and the memory behind them."""

    def __init__(self, acl, dtype_code, arrays, out_specs, fmt=ND):
        self.acl, self.descs, self.bufs, self.ptrs = acl, [], [], []
        self.in_descs, self.in_bufs = self._add(dtype_code, arrays, fmt)
        self.outs = out_specs
        self.out_descs, self.out_bufs = self._add(None, [np.zeros(s, dt) for dt, s in out_specs], fmt, upload=False)

    def _add(self, code, arrays, fmt, upload=True):
        descs, bufs = [], []
        for a in arrays:
            c = code if code is not None else {np.dtype(np.float32): ACL_FLOAT, np.dtype(np.float16): ACL_FLOAT16,
                                               np.dtype(np.int32): ACL_INT32}[a.dtype]
            d = self.acl.create_tensor_desc(c, list(a.shape), fmt)
            ptr, ret = self.acl.rt.malloc(max(a.nbytes, 1), 0)
            assert ret == 0
            if upload:
                assert self.acl.rt.memcpy(ptr, a.nbytes, a.ctypes.data, a.nbytes, 1) == 0
            b = self.acl.create_data_buffer(ptr, a.nbytes)
            descs.append(d)
            bufs.append(b)
            self.ptrs.append(ptr)
        return descs, bufs

    def result(self, i=0):
        dt, shape = self.outs[i]
        out = np.zeros(shape, dt)
        ptr = self.acl.get_data_buffer_addr(self.out_bufs[i])
        assert self.acl.rt.memcpy(out.ctypes.data, out.nbytes, ptr, out.nbytes, 2) == 0
        return out

    def free(self):
        for d in self.in_descs + self.out_descs:
            assert self.acl.destroy_tensor_desc(d) is None
        for b in self.in_bufs + self.out_bufs:
            assert self.acl.destroy_data_buffer(b) == 0
        for p in self.ptrs:
            assert self.acl.rt.free(p) == 0


def test_single_op_add_sample_runs_unchanged(op_dir):
    env = {"NPUSIM_BACKEND": "local", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, str(PROGRAMS / "single_op_add.py"), str(op_dir)], capture_output=True,
                          text=True, env=env, timeout=100, cwd=op_dir, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "unmatched shape: 100024" in done.stdout and done.stdout.strip().endswith("OK")


def test_execute_v2_runs_matched_models_and_refuses_the_rest(acl0, op_dir):
    acl = acl0
    assert acl.op.set_model_dir(str(op_dir)) == 0
    stream, _ = acl.rt.create_stream()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 10)).astype(np.float32)
    t = Dev(acl, ACL_FLOAT, [x], [(np.float32, (4, 10))])
    attr = acl.op.create_attr()
    assert acl.op.set_attr_int(attr, "axis", 1) == 0
    assert acl.op.execute_v2("Softmax", t.in_descs, t.in_bufs, t.out_descs, t.out_bufs, attr, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(t.result(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    # another attribute value than the model was compiled with: no model matches
    assert acl.op.set_attr_int(attr, "axis", 0) == 0
    assert acl.op.execute_v2("Softmax", t.in_descs, t.in_bufs, t.out_descs, t.out_bufs, attr, stream) == OP_NOT_FOUND
    msg = acl.get_recent_err_msg()
    assert "MatchOpModel opName = Softmax fail" in msg and "float32[4, 10]" in msg
    # an op type nobody compiled
    assert acl.op.execute_v2("Relu", t.in_descs, t.in_bufs, t.out_descs, t.out_bufs, 0, stream) == OP_NOT_FOUND
    # online compile and run needs no model (CANN compiles it, npusim runs its kernel)
    assert acl.op.compile_and_execute("Relu", t.in_descs, t.in_bufs, t.out_descs, t.out_bufs, 0, 0, 0, None,
                                      stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    np.testing.assert_array_equal(t.result(), np.maximum(x, 0))      # Relu: exact on every CPU
    # compile registers the op: execute_v2 then finds it
    assert acl.op.compile("Relu", t.in_descs, t.out_descs, 0, 0, 0, "") == 0
    assert acl.op.execute_v2("Relu", t.in_descs, t.in_bufs, t.out_descs, t.out_bufs, 0, stream) == 0
    acl.op.destroy_attr(attr)
    t.free()
    assert acl.rt.destroy_stream(stream) == 0


def test_set_model_dir_and_load_codes(acl0, tmp_path):
    acl = acl0
    assert acl.op.set_model_dir(str(tmp_path / "missing")) == READ_MODEL_FAILURE
    assert "scan dir failed" in acl.get_recent_err_msg()
    (tmp_path / "graph.om").write_bytes(op_model("Relu", [("float32", [2])], [("float32", [2])])[:40])
    assert acl.op.set_model_dir(str(tmp_path)) == 0            # an unparseable file is skipped, as CANN does
    data = op_model("Mul", [("int32", [3])] * 2, [("int32", [3])])
    assert acl.op.load(acl.util.bytes_to_ptr(data), len(data)) == 0
    assert acl.op.load(data, len(data)) == 0                   # a bytes object works too
    assert acl.op.load(data, 0) == INVALID
    g = GraphBuilder("two")
    x = g.input("x", "float32", [2])
    g.output("y", g.op("Relu", [g.op("Relu", [x])]))
    two = g.serialize()
    assert acl.op.load(two, len(two)) == 100013 and "not a single-operator model" in acl.get_recent_err_msg()
    a, b = np.array([1, 2, 3], np.int32), np.array([4, 5, -6], np.int32)
    t = Dev(acl, ACL_INT32, [a, b], [(np.int32, (3,))])
    assert acl.op.execute_v2("Mul", t.in_descs, t.in_bufs, t.out_descs, t.out_bufs, 0, 0) == 0
    assert acl.rt.synchronize_device() == 0
    assert t.result().tolist() == [4, 10, -18]
    t.free()


def test_execution_checks_outputs_formats_and_sizes(acl0):
    acl = acl0
    x = np.ones((2, 3), np.float32)
    wrong = Dev(acl, ACL_FLOAT, [x, x], [(np.float32, (3, 2))])
    assert acl.op.compile_and_execute("Add", wrong.in_descs, wrong.in_bufs, wrong.out_descs, wrong.out_bufs, 0, 0, 0,
                                      "", 0) == OP_OUTPUT_NOT_MATCH
    assert "output 0 is float32[2, 3], its desc says float32[3, 2]" in acl.get_recent_err_msg()
    blocked = Dev(acl, ACL_FLOAT, [x, x], [(np.float32, (2, 3))], fmt=NC1HWC0)
    assert acl.op.compile_and_execute("Add", blocked.in_descs, blocked.in_bufs, blocked.out_descs, blocked.out_bufs,
                                      0, 0, 0, "", 0) == FORMAT_NOT_MATCH
    assert acl.op.compile_and_execute("NoSuchOp", wrong.in_descs, wrong.in_bufs, wrong.out_descs, wrong.out_bufs, 0,
                                      0, 0, "", 0) == OP_NOT_FOUND
    assert acl.op.compile_and_execute("Add", wrong.in_descs, wrong.in_bufs, wrong.out_descs, wrong.out_bufs, 0, 7, 0,
                                      "", 0) == INVALID
    assert acl.op.execute_v2("Add", wrong.in_descs, wrong.in_bufs[:1], wrong.out_descs, wrong.out_bufs, 0, 0) == INVALID
    big = acl.create_tensor_desc(ACL_FLOAT, [4, 3], ND)            # more bytes than the buffer holds
    assert acl.op.compile_and_execute("Add", [big, big], wrong.in_bufs, [big], wrong.out_bufs, 0, 0, 0, "",
                                      0) == INVALID
    assert "data buffer has 24 bytes, the desc needs 48" in acl.get_recent_err_msg()
    # CANN's Cast spelling (dst_type) runs the ONNX-named kernel
    cast_out = Dev(acl, ACL_FLOAT, [np.array([1.5, -2.25], np.float32)], [(np.float16, (2,))])
    attr = acl.op.create_attr()
    assert acl.op.set_attr_data_type(attr, "dst_type", ACL_FLOAT16) == 0
    assert acl.op.compile_and_execute("Cast", cast_out.in_descs, cast_out.in_bufs, cast_out.out_descs,
                                      cast_out.out_bufs, attr, 0, 0, "", 0) == 0
    assert acl.rt.synchronize_device() == 0
    assert cast_out.result().tolist() == [1.5, -2.25]
    acl.destroy_tensor_desc(big)
    for t in (wrong, blocked, cast_out):
        t.free()
    acl.op.destroy_attr(attr)


def test_tensor_desc_getters_and_setters(acl0):
    acl = acl0
    d = acl.create_tensor_desc(ACL_FLOAT16, [2, 3, 4], NCHW)
    assert d != 0 and acl.get_tensor_desc_type(d) == ACL_FLOAT16 and acl.get_tensor_desc_format(d) == NCHW
    assert acl.get_tensor_desc_num_dims(d) == 3 and acl.get_tensor_desc_element_count(d) == 24
    assert acl.get_tensor_desc_size(d) == 48
    assert acl.get_tensor_desc_dim(d, 2) == 4 and acl.get_tensor_desc_dim_v2(d, 1) == (3, 0)
    assert acl.get_tensor_desc_dim_v2(d, 3) == (-1, INVALID)
    assert acl.get_tensor_desc_name(d) == "" and acl.set_tensor_desc_name(d, "x") is None
    assert acl.get_tensor_desc_name(d) == "x"
    assert acl.set_tensor_shape(d, [6, 4]) == 0 and acl.get_tensor_desc_size(d) == 48
    assert acl.set_tensor_format(d, ND) == 0 and acl.get_tensor_desc_format(d) == ND
    assert acl.set_tensor_place_ment(d, 1) == 0 and acl.set_tensor_place_ment(d, 5) == INVALID
    dyn = acl.create_tensor_desc(ACL_FLOAT, [-1, 8], ND)
    assert acl.get_tensor_desc_dim_v2(dyn, 0) == (-1, 0) and acl.get_tensor_desc_size(dyn) == 0
    rank = acl.create_tensor_desc(ACL_FLOAT, [-2], ND)
    assert acl.get_tensor_desc_num_dims(rank) == 0xFFFFFFFFFFFFFFFE
    assert acl.create_tensor_desc(99, [2], ND) == 0
    assert "data_type 99" in acl.get_recent_err_msg()
    assert acl.create_tensor_desc(ACL_FLOAT, [2, -3], ND) == 0
    assert acl.create_tensor_desc(ACL_FLOAT, [2], 12345) == 0
    assert acl.create_tensor_desc(-1, [], -1) != 0             # CANN's marker of an unused optional input
    for h in (d, dyn, rank):
        assert acl.destroy_tensor_desc(h) is None
    assert acl.get_tensor_desc_type(d) == -1                   # destroyed: the getter's default
    assert "destroyed already" in acl.get_recent_err_msg()


def test_attr_setters_check_types_as_the_binding_does(acl0):
    acl = acl0
    a = acl.op.create_attr()
    good = [(acl.op.set_attr_bool, True), (acl.op.set_attr_int, -7), (acl.op.set_attr_float, 0.1),
            (acl.op.set_attr_string, "SAME"), (acl.op.set_attr_data_type, ACL_INT64),
            (acl.op.set_attr_list_bool, [1, 0]), (acl.op.set_attr_list_int, np.array([1, 2], np.int64)),
            (acl.op.set_attr_list_float, [1.0, 2.5]), (acl.op.set_attr_list_string, ["a", "b"]),
            (acl.op.set_attr_list_data_type, [0, 1]), (acl.op.set_attr_list_list_int, [[1, 2], [3]])]
    for fn, value in good:
        assert fn(a, "k", value) == 0, fn.__name__
    bad = [(acl.op.set_attr_int, 1.5), (acl.op.set_attr_int, 1 << 63), (acl.op.set_attr_float, "x"),
           (acl.op.set_attr_string, 3), (acl.op.set_attr_list_int, [1, "2"]), (acl.op.set_attr_data_type, 999),
           (acl.op.set_attr_list_list_int, [1, 2]), (acl.op.set_attr_bool, 300)]
    for fn, value in bad:
        assert fn(a, "k", value) == INVALID, (fn.__name__, value)
    assert acl.op.set_attr_int(a, "", 1) == INVALID
    assert acl.op.set_attr_int(12345, "k", 1) == INVALID
    assert acl.op.destroy_attr(a) is None
    assert acl.op.set_attr_int(a, "k", 1) == INVALID


def test_app_log_writes_the_programs_line_to_the_plog(acl0, tmp_path, monkeypatch):
    monkeypatch.setenv("ASCEND_SLOG_PRINT_TO_STDOUT", "0")
    acl = acl0
    assert (acl.ACL_DEBUG, acl.ACL_INFO, acl.ACL_WARNING, acl.ACL_ERROR) == (0, 1, 2, 3)
    assert acl.app_log(acl.ACL_ERROR, "[acllite_utils.py:42 check_ret]model load failed") is None
    from rt.diag import slog
    path = slog.current_file()
    assert path is not None
    lines = [ln for ln in Path(path).read_text(encoding="utf-8").splitlines() if "model load failed" in ln]
    assert lines and lines[-1].startswith("[ERROR] APP(") and "[test_op.py:" in lines[-1]
    assert acl.app_log(7, "x") == INVALID and acl.app_log(1, b"bytes") == INVALID
    assert acl.app_log(acl.ACL_ERROR, "y" * 5000) is None
    last = Path(path).read_text(encoding="utf-8").splitlines()[-1]
    assert last.rsplit("]", 1)[1] == "y" * 1024


def test_op_models_written_by_atc_singleop_run(acl0, tmp_path):
    """The op list of CANN's single-op samples, through npusim's ``atc --singleop`` writer, then execute_v2."""
    from rt.mdl.onnx import singleop  # needs no onnx package: op lists are JSON
    acl = acl0
    ops = tmp_path / "op_list.json"
    ops.write_text('[{"op": "Cast", "input_desc": [{"format": "ND", "shape": [4], "type": "float32"}],'
                   ' "output_desc": [{"format": "ND", "shape": [4], "type": "float16"}],'
                   ' "attr": [{"name": "to", "type": "data_type", "value": "DT_FLOAT16"}]}]')
    written = singleop.generate(str(ops), str(tmp_path / "op_models"))
    assert [Path(p).name for p in written] == ["0_Cast_0_2_4_1_2_4.om"]
    assert acl.op.set_model_dir(str(tmp_path / "op_models")) == 0
    x = np.array([0.5, -1.25, 3.0, 65504.0], np.float32)
    t = Dev(acl, ACL_FLOAT, [x], [(np.float16, (4,))])
    attr = acl.op.create_attr()
    assert acl.op.set_attr_data_type(attr, "to", ACL_FLOAT16) == 0
    assert acl.op.execute_v2("Cast", t.in_descs, t.in_bufs, t.out_descs, t.out_bufs, attr, 0) == 0
    assert acl.rt.synchronize_device() == 0
    np.testing.assert_array_equal(t.result(), x.astype(np.float16))
    assert acl.op.set_attr_data_type(attr, "to", ACL_INT32) == 0           # compiled for float16 only
    assert acl.op.execute_v2("Cast", t.in_descs, t.in_bufs, t.out_descs, t.out_bufs, attr, 0) == OP_NOT_FOUND
    acl.op.destroy_attr(attr)
    t.free()


def test_cann_spellings_through_atc_and_execute_v2(acl0, tmp_path):
    """CANN's op types and attributes as the samples' op lists spell them (Cast's dst_type and truncate, RealDiv,
    Maximum, SoftmaxV2's axes, MatMul's transpose_x1/x2 and bias) compile with ``atc --singleop``, match
    ``execute_v2`` called with the same spelling, and compute what numpy does; ``compile_and_execute`` agrees."""
    import json
    from rt.mdl.onnx import singleop
    acl = acl0

    def nd(dtype, shape):
        return {"format": "ND", "shape": shape, "type": dtype}
    ops = [
        {"op": "Cast", "input_desc": [nd("float", [2, 4])], "output_desc": [nd("float16", [2, 4])],
         "attr": [{"name": "truncate", "type": "bool", "value": False}, {"name": "dst_type", "type": "int", "value": 1}]},
        {"op": "RealDiv", "input_desc": [nd("float", [2, 4])] * 2, "output_desc": [nd("float", [2, 4])]},
        {"op": "Maximum", "input_desc": [nd("float", [2, 4])] * 2, "output_desc": [nd("float", [2, 4])]},
        {"op": "SoftmaxV2", "input_desc": [nd("float", [2, 4])], "output_desc": [nd("float", [2, 4])],
         "attr": [{"name": "axes", "type": "list_int", "value": [0]}]},
        {"op": "MatMul", "input_desc": [nd("float", [4, 2]), nd("float", [3, 4]), nd("float", [3])],
         "output_desc": [nd("float", [2, 3])],
         "attr": [{"name": "transpose_x1", "type": "bool", "value": True},
                  {"name": "transpose_x2", "type": "bool", "value": True}]},
    ]
    (tmp_path / "ops.json").write_text(json.dumps(ops))
    assert len(singleop.generate(str(tmp_path / "ops.json"), str(tmp_path / "models"))) == 5
    assert acl.op.set_model_dir(str(tmp_path / "models")) == 0
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((2, 4)).astype(np.float32), rng.uniform(1, 2, (2, 4)).astype(np.float32)
    a, b, bias = (rng.standard_normal(s).astype(np.float32) for s in ((4, 2), (3, 4), (3,)))
    soft = np.exp(x - x.max(0)) / np.exp(x - x.max(0)).sum(0)
    cases = [("Cast", [x], [(np.float16, (2, 4))], [("bool", "truncate", False), ("int", "dst_type", 1)],
              x.astype(np.float16)),
             ("RealDiv", [x, y], [(np.float32, (2, 4))], [], x / y),
             ("Maximum", [x, y], [(np.float32, (2, 4))], [], np.maximum(x, y)),
             ("SoftmaxV2", [x], [(np.float32, (2, 4))], [("list_int", "axes", [0])], soft),
             ("MatMul", [a, b, bias], [(np.float32, (2, 3))],
              [("bool", "transpose_x1", True), ("bool", "transpose_x2", True)], a.T @ b.T + bias)]
    for op, ins, outs, attrs, want in cases:
        for run in ("execute_v2", "compile_and_execute"):
            t = Dev(acl, None, ins, outs)
            attr = acl.op.create_attr()
            for kind, name, value in attrs:
                assert getattr(acl.op, f"set_attr_{kind}")(attr, name, value) == 0
            if run == "execute_v2":
                ret = acl.op.execute_v2(op, t.in_descs, t.in_bufs, t.out_descs, t.out_bufs, attr, 0)
            else:
                ret = acl.op.compile_and_execute(op, t.in_descs, t.in_bufs, t.out_descs, t.out_bufs, attr, 0, 0, None, 0)
            assert ret == 0, (op, run, acl.get_recent_err_msg())
            assert acl.rt.synchronize_device() == 0
            np.testing.assert_allclose(t.result().astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-5)
            acl.op.destroy_attr(attr)
            t.free()
    # a value no kernel expresses: named, with ACL_ERROR_OP_ATTR_NOT_MATCH
    t = Dev(acl, None, [x], [(np.float32, (2, 4))])
    attr = acl.op.create_attr()
    assert acl.op.set_attr_list_int(attr, "axes", [0, 1]) == 0
    assert acl.op.compile_and_execute("SoftmaxV2", t.in_descs, t.in_bufs, t.out_descs, t.out_bufs, attr, 0, 0, None,
                                      0) == 100023
    assert "axes=[0, 1]" in acl.get_recent_err_msg()
    acl.op.destroy_attr(attr)
    t.free()


def test_op_handles_run_a_matched_operator_again_and_again(acl0, op_dir):
    """acl.op.create_handle matches the loaded op models once (as execute_v2 would), execute_with_handle runs it
    on new buffers each time, destroy_handle releases it; an unmatched op is 100024, a stale handle 100000."""
    acl = acl0
    assert acl.op.set_model_dir(str(op_dir)) == 0
    rng = np.random.default_rng(11)
    a, b = (rng.standard_normal((8, 16)).astype(np.float16) for _ in range(2))
    t = Dev(acl, ACL_FLOAT16, [a, b], [(np.float16, (8, 16))])
    handle, ret = acl.op.create_handle("Add", t.in_descs, t.out_descs, 0)
    assert ret == 0 and handle
    for _ in range(2):
        assert acl.op.execute_with_handle(handle, t.in_bufs, t.out_bufs, 0) == 0
        assert acl.rt.synchronize_device() == 0
        np.testing.assert_allclose(t.result().astype(np.float32), (a + b).astype(np.float32), rtol=1e-3)
    assert acl.op.execute_with_handle(handle, t.in_bufs[:1], t.out_bufs, 0) == INVALID
    assert acl.op.destroy_handle(handle) is None
    assert acl.op.execute_with_handle(handle, t.in_bufs, t.out_bufs, 0) == INVALID
    wrong = acl.create_tensor_desc(ACL_FLOAT16, [4, 16], ND)                # no model for this shape
    assert acl.op.create_handle("Add", [wrong, wrong], [wrong], 0) == (0, OP_NOT_FOUND)
    acl.destroy_tensor_desc(wrong)
    t.free()
