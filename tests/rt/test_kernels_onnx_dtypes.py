"""Every float kernel an ONNX model needs, in float16 and bfloat16: the result equals the float32 kernel's
on the same (rounded) inputs within the narrow type's precision, and keeps the narrow dtype. Catches
code paths that assume a numpy float kind (bfloat16's is "V")."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rt.dtypes import BFLOAT16

sys.path.insert(0, str(Path(__file__).resolve().parent))
from onnx_oracle import F16, F32, close, run

rng = np.random.default_rng(11)


def _x(*shape):
    return rng.standard_normal(shape).astype(F32)


CASES = [  # op, float inputs, attrs
    ("Conv", [_x(1, 4, 6, 6), _x(6, 2, 3, 3) * 0.3, _x(6)], {"group": 2, "pads": [1, 1, 1, 1]}),
    ("Conv", [_x(1, 16, 5, 5), _x(4, 16, 1, 1) * 0.3], {"strides": [2, 2]}),
    ("Conv", [_x(1, 3, 6, 6), _x(3, 1, 3, 3) * 0.3], {"group": 3}),
    ("ConvTranspose", [_x(1, 4, 3, 3), _x(4, 2, 3, 3) * 0.3], {"strides": [2, 2]}),
    ("BatchNormalization", [_x(2, 3, 4), _x(3), _x(3), _x(3), np.abs(_x(3)) + 0.5], {}),
    ("InstanceNormalization", [_x(2, 3, 4), _x(3), _x(3)], {}),
    ("MaxPool", [_x(1, 2, 5, 5)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2], "ceil_mode": 1}),
    ("AveragePool", [_x(1, 2, 5, 5)], {"kernel_shape": [2, 2], "count_include_pad": 1, "pads": [1, 1, 0, 0]}),
    ("GlobalAveragePool", [_x(1, 2, 5, 5)], {}),
    ("GlobalMaxPool", [_x(1, 2, 5, 5)], {}),
    ("Resize", [_x(1, 2, 3, 4)], {"scales": [1, 1, 2, 1.5], "mode": "linear"}),
    ("Resize", [_x(1, 2, 3, 4)], {"sizes": [1, 2, 5, 7], "mode": "nearest"}),
    ("Upsample", [_x(1, 2, 3, 4)], {"scales": [1, 1, 2, 2]}),
    ("Clip", [_x(3, 4)], {"min": -0.5, "max": 0.5}),
    ("Erf", [_x(3, 4)], {}),
    ("HardSigmoid", [_x(3, 4)], {}),
    ("HardSwish", [_x(3, 4)], {}),
    ("LeakyRelu", [_x(3, 4)], {}),
    ("PRelu", [_x(3, 4), _x(4)], {}),
    ("Softplus", [_x(3, 4)], {}),
    ("Mish", [_x(3, 4)], {}),
    ("Elu", [_x(3, 4)], {}),
    ("Selu", [_x(3, 4)], {}),
    ("Sign", [_x(3, 4)], {}),
    ("Abs", [_x(3, 4)], {}),
    ("Reciprocal", [np.abs(_x(3, 4)) + 0.5], {}),
    ("Floor", [_x(3, 4) * 3], {}),
    ("Dropout", [_x(3, 4)], {}),
    ("Min", [_x(3, 4), _x(4)], {}),
    ("Sum", [_x(3, 4), _x(4), _x(3, 1)], {}),
    ("Mean", [_x(3, 4), _x(4)], {}),
    ("Mod", [_x(3, 4), np.abs(_x(4)) + 0.5], {"fmod": 1}),
    ("Pow", [np.abs(_x(3, 4)) + 0.5, _x(4)], {}),
    ("Pad", [_x(3, 4)], {"pads": [1, 0, 2, 1], "mode": "reflect"}),
    ("Tile", [_x(2, 3)], {"repeats": [2, 1]}),
    ("Expand", [_x(3, 1)], {"shape": [2, 3, 4]}),
    ("Flatten", [_x(2, 3, 4)], {}),
    ("ReduceMin", [_x(3, 4)], {"axes": [1]}),
    ("ReduceL2", [_x(3, 4)], {"axes": [0]}),
    ("ReduceLogSumExp", [_x(3, 4)], {}),
]


@pytest.mark.parametrize("dtype, tol", [(F16, 2e-2), (BFLOAT16, 6e-2)], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op, inputs, attrs", CASES, ids=[c[0] for c in CASES])
def test_narrow_floats_match_float32(op, inputs, attrs, dtype, tol):
    narrow = [a.astype(dtype) for a in inputs]
    got = run(op, *narrow, **attrs)
    want = run(op, *[a.astype(F32) for a in narrow], **attrs)
    assert got.dtype == dtype, (op, got.dtype)
    close(got.astype(F32), want, tol * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("dtype", [F16, BFLOAT16], ids=["float16", "bfloat16"])
def test_narrow_float_comparisons_topk_argmax(dtype):
    a, b = _x(3, 4).astype(dtype), _x(4).astype(dtype)
    close(run("Less", a, b), a.astype(F32) < b.astype(F32))
    close(run("Equal", a, a), np.ones((3, 4), bool))
    values, idx = run("TopK", a, K=2)
    assert values.dtype == dtype
    close(idx, run("TopK", a.astype(F32), K=2)[1])
    close(run("ArgMax", a, axis=1), np.argmax(a.astype(F32), axis=1, keepdims=True))
