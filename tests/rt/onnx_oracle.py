"""Shared by test_kernels.py and the test_kernels_onnx* files: running one card kernel on numpy arrays, checking AclErrors,
and the onnxruntime oracle (one ONNX node in a model, constant parameters as initializers)."""

from __future__ import annotations

import numpy as np
import pytest

from rt.errors import AclError
from rt.kernels import registry
from rt.kernels.registry import TensorSpec

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I64, BOOL = np.dtype(np.int64), np.dtype(np.bool_)
INVALID, INPUT_MISMATCH, UNSUPPORTED = 100000, 100021, 100026


def run(op, *inputs, **attrs):
    """infer + compute of one op on numpy arrays; one array or a list for several outputs."""
    specs = registry.infer(op, [TensorSpec(a.shape, a.dtype) for a in inputs], attrs)
    outs = [np.full(s.shape, 77, s.dtype) for s in specs]  # a kernel must write every element
    registry.get_op(op).compute(list(inputs), outs, attrs)
    return outs[0] if len(outs) == 1 else outs


def spec_of(op, shapes_dtypes, **attrs):
    return registry.infer(op, [TensorSpec(s, d) for s, d in shapes_dtypes], attrs)


def fails(code, *fragments):
    """pytest.raises(AclError) that also checks the code and pieces of the message."""
    class _Check:
        def __enter__(self):
            self.ctx = pytest.raises(AclError)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            swallowed = self.ctx.__exit__(*exc)
            assert self.info.value.code == code, self.info.value
            for fragment in fragments:
                assert fragment in self.info.value.message, (fragment, self.info.value.message)
            return swallowed
    return _Check()


class Const:
    """An ONNX node input given as an initializer (a folded attribute on our side)."""

    def __init__(self, value):
        self.value = np.asarray(value)


def ort(op, inputs, attrs=None, *, out_dtypes=(F32,), opset=18):
    """Run one ONNX node in onnxruntime. ``inputs``: arrays (graph inputs), ``Const`` (initializers)
    or None (an omitted optional input)."""
    pytest.importorskip("onnx")
    ort_mod = pytest.importorskip("onnxruntime")
    from onnx import helper, numpy_helper

    names, graph_inputs, inits, feed = [], [], [], {}
    for i, value in enumerate(inputs):
        if value is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if isinstance(value, Const):
            inits.append(numpy_helper.from_array(value.value, name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape))
            feed[name] = value
    outs = [f"out{i}" for i in range(len(out_dtypes))]
    node = helper.make_node(op, names, outs, **(attrs or {}))
    graph = helper.make_graph([node], "one_node", graph_inputs, [
        helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(np.dtype(d)), None)
        for o, d in zip(outs, out_dtypes)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    session = ort_mod.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, feed)
    return got[0] if len(got) == 1 else got


def close(got, want, tol=1e-5):
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got.astype(F64), want.astype(F64), rtol=tol, atol=tol)
