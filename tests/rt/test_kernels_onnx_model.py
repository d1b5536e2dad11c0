"""A small vision model built from the ONNX-named kernels as a user would (GraphBuilder, dynamic batch),
saved, parsed and executed by the card's executor (no Ray), against onnxruntime running the same
network written as an ONNX model. Checks that the kernels' shape inference holds with a dynamic batch
through the model format's validation, and that the results agree."""

from __future__ import annotations

import numpy as np
import pytest

from rt.card.executor import Executor
from rt.mdl import format as fmt
from rt.mdl.builder import GraphBuilder

rng = np.random.default_rng(7)
F32 = np.float32


def _params():
    p = {"w1": rng.standard_normal((16, 3, 3, 3)) * 0.3, "b1": rng.standard_normal(16) * 0.1,
         "scale": rng.uniform(0.5, 1.5, 16), "shift": rng.standard_normal(16) * 0.1,
         "mean": rng.standard_normal(16) * 0.1, "var": rng.uniform(0.5, 1.5, 16),
         "wd": rng.standard_normal((16, 1, 3, 3)) * 0.3, "wp": rng.standard_normal((24, 16, 1, 1)) * 0.3,
         "wt": rng.standard_normal((24, 8, 2, 2)) * 0.3, "fc": rng.standard_normal((10, 8)) * 0.3,
         "fcb": rng.standard_normal(10) * 0.1}
    return {k: v.astype(F32) for k, v in p.items()}


# (op, inputs, attrs, ONNX-only constant inputs appended after the data inputs)
LAYERS = [
    ("Conv", ["x", "w1", "b1"], {"pads": [1, 1, 1, 1], "strides": [2, 2]}, {}),
    ("BatchNormalization", [None, "scale", "shift", "mean", "var"], {"epsilon": 1e-5}, {}),
    ("Relu", [None], {}, {}),
    ("MaxPool", [None], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}, {}),
    ("Conv", [None, "wd"], {"group": 16, "pads": [1, 1, 1, 1]}, {}),
    ("Clip", [None], {"min": 0.0, "max": 6.0}, {"min": np.array(0.0, F32), "max": np.array(6.0, F32)}),
    ("Conv", [None, "wp"], {}, {}),
    ("HardSwish", [None], {}, {}),
    ("ConvTranspose", [None, "wt"], {"strides": [2, 2]}, {}),
    ("Resize", [None], {"scales": [1.0, 1.0, 0.5, 0.5], "mode": "linear"},
     {"roi": np.zeros(0, F32), "scales": np.array([1.0, 1.0, 0.5, 0.5], F32)}),
    ("AveragePool", [None], {"kernel_shape": [2, 2], "pads": [0, 0, 1, 1], "count_include_pad": 1}, {}),
    ("GlobalAveragePool", [None], {}, {}),
    ("Flatten", [None], {}, {}),
    ("Gemm", [None, "fc", "fcb"], {"transB": 1}, {}),
    ("Softmax", [None], {"axis": 1}, {}),
]


def _graphbuilder_model(p) -> bytes:
    g = GraphBuilder("small_cnn")
    v = g.input("x", "float32", [-1, 3, 32, 32])
    consts = {k: g.constant(k, a) for k, a in p.items()}
    for i, (op, inputs, attrs, _) in enumerate(LAYERS):
        args = [v if n in (None, "x") else consts[n] for n in inputs]
        v = g.op(op, args, name=f"{op.lower()}{i}", **attrs)
    g.output("probs", v)
    g.set_dynamic_batch([1, 3])
    return g.serialize()


def _onnx_model(p) -> bytes:
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(a, k) for k, a in p.items()]
    nodes, prev = [], "x"
    for i, (op, inputs, attrs, folded) in enumerate(LAYERS):
        names = [prev if n in (None, "x") else n for n in inputs]
        onnx_attrs = {k: v for k, v in attrs.items() if k not in folded}
        if op == "Resize":
            names += ["", ""]
        for key, arr in folded.items():
            inits.append(numpy_helper.from_array(arr, f"{op}{i}_{key}"))
            if op == "Resize":
                names[{"roi": 1, "scales": 2}[key]] = f"{op}{i}_{key}"
            else:
                names.append(f"{op}{i}_{key}")
        nodes.append(helper.make_node(op, names, [f"t{i}"], **onnx_attrs))
        prev = f"t{i}"
    graph = helper.make_graph(nodes, "small_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                 ["N", 3, 32, 32])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.parametrize("batch", [1, 3])
def test_small_cnn_through_the_model_format_matches_onnxruntime(batch):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    p = _params()
    model = fmt.parse(_graphbuilder_model(p))
    assert model.outputs[0].shape == (-1, 10)
    x = rng.standard_normal((batch, 3, 32, 32)).astype(F32)
    (got,) = Executor(model).run([x])
    session = ort.InferenceSession(_onnx_model(p), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"x": x})
    assert got.shape == want.shape == (batch, 10)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-5)
