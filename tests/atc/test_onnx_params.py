"""ONNX ops whose parameters come as inputs or implied by the node (opset-13 Split without ``split``, Trilu's
``k``, CumSum's ``axis``): atc folds them into the card kernels' attributes, and the converted one-node models
match onnxruntime."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import atc_helpers as h

h.require_extras()


def one_node(path, op, inputs, outputs, inits=(), opset=13, **attrs):
    """Save a one-node ONNX model: ``inputs``/``outputs`` are (name, shape) with float32, ``inits`` constants."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    node = helper.make_node(op, [i[0] for i in inputs] + [n for n, _ in inits], [o[0] for o in outputs], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


CASES = {
    "split13_equal": {"op": "Split", "inputs": [("x", [2, 6])], "outputs": [("a", [2, 2]), ("b", [2, 2]), ("c", [2, 2])],
                          "axis": 1},
    "trilu_k": {"op": "Trilu", "inputs": [("x", [3, 4, 4])], "outputs": [("y", [3, 4, 4])],
                    "inits": [("k", np.array(-1, np.int64))], "opset": 14, "upper": 0},
    "cumsum_axis": {"op": "CumSum", "inputs": [("x", [3, 5])], "outputs": [("y", [3, 5])],
                        "inits": [("axis", np.array(1, np.int64))], "opset": 14, "reverse": 1},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_parameter_inputs_fold_into_attributes_and_match_onnxruntime(case, atc, tmp_path, rt_local):
    spec = dict(CASES[case])
    model = one_node(tmp_path / f"{case}.onnx", **spec)
    status, out = atc(f"--model={model}", "--framework=5", f"--output={tmp_path / case}", "--soc_version=Ascend910B1")
    assert status == 0, out
    feeds = [np.random.default_rng(1).standard_normal(s).astype(np.float32) for _, s in spec["inputs"]]
    rt_local.set_device(0)
    got = h.on_card(rt_local, tmp_path / f"{case}.om", feeds)
    want = h.onnxruntime(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
