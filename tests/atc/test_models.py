"""atc on models exported from torch (ResNet-18, MobileNetV2, a BERT-style encoder): the converted models run
on simulated cards through rt.mdl and match onnxruntime; dynamic batch gears; batch-sharded with
hccl.load_sharded."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import atc_helpers as h

h.require_extras()

SOC = "Ascend910B1"
VISION = h.needs_kernels("Conv", "MaxPool", "Relu", "Add", "Gemm")


def convert(atc, tmp_path, onnx_path, name, *flags):
    status, out = atc(f"--model={onnx_path}", "--framework=5", f"--output={tmp_path / name}", f"--soc_version={SOC}",
                      *flags)
    assert status == 0, out
    assert out.splitlines() == ["ATC start working now, please wait for a moment.",
                                "ATC run success, welcome to the next use."]
    return tmp_path / f"{name}.om"


def images(batch, seed=0, hw=64):
    return np.random.default_rng(seed).standard_normal((batch, 3, hw, hw)).astype(np.float32)


def assert_close(got, want, rtol=1e-4, atol=1e-4):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@VISION
def test_resnet18_with_dynamic_batch_gears_matches_onnxruntime(atc, tmp_path, onnx_models, rt_local):
    om = convert(atc, tmp_path, onnx_models["resnet18"], "resnet18", "--input_shape=input:-1,3,64,64",
                 "--dynamic_batch_size=1,2,4")
    rt_local.set_device(0)
    for batch in (1, 4):
        x = images(batch, seed=batch)
        assert_close(h.on_card(rt_local, om, [x], gear=batch), h.onnxruntime(onnx_models["resnet18"], [x]))


@h.needs_kernels("Conv", "Clip", "Add", "Gemm")
def test_mobilenetv2_matches_onnxruntime(atc, tmp_path, onnx_models, rt_local):
    om = convert(atc, tmp_path, onnx_models["mobilenetv2"], "mobilenetv2")
    rt_local.set_device(0)
    x = images(1, seed=3)
    assert_close(h.on_card(rt_local, om, [x]), h.onnxruntime(onnx_models["mobilenetv2"], [x]))


def bert_feeds(batch, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 1000, (batch, 16), dtype=np.int64)
    mask = np.ones((batch, 16), np.int64)
    mask[:, 12:] = 0                     # padded tail: the attention bias path is exercised
    return [ids, mask]


@h.needs_kernels("Erf", "LayerNormalization", "MatMul", "Softmax", "Unsqueeze")
def test_bert_encoder_matches_onnxruntime(atc, tmp_path, onnx_models, rt_local):
    om = convert(atc, tmp_path, onnx_models["bert"], "bert")
    rt_local.set_device(0)
    feeds = bert_feeds(2)
    assert_close(h.on_card(rt_local, om, feeds), h.onnxruntime(onnx_models["bert"], feeds))


@h.needs_kernels("Erf", "LayerNormalization", "MatMul", "Softmax", "Unsqueeze")
def test_bert_with_dynamic_batch_folds_the_shape_arithmetic(atc, tmp_path, onnx_models, rt_local):
    """The dynamic-batch export computes every view() from Shape/Gather/Concat; the batch stays a gear."""
    om = convert(atc, tmp_path, onnx_models["bert_dyn"], "bert_dyn",
                 "--input_shape=input_ids:-1,16;attention_mask:-1,16", "--dynamic_batch_size=1,3,8")
    from rt.mdl import format as fmt
    model = fmt.parse(om.read_bytes())
    assert model.batch_sizes == (1, 3, 8)
    assert not {"Shape", "Concat", "Range", "ConstantOfShape"} & {n.op for n in model.nodes}
    rt_local.set_device(0)
    feeds = bert_feeds(3, seed=1)
    assert_close(h.on_card(rt_local, om, feeds, gear=3), h.onnxruntime(onnx_models["bert_dyn"], feeds))


@VISION
def test_resnet18_batch_sharded_over_four_cards(atc, tmp_path, onnx_models, rt_local):
    import hccl
    from hccl import load_sharded
    om = convert(atc, tmp_path, onnx_models["resnet18"], "resnet18_dyn", "--input_shape=input:-1,3,64,64",
                 "--dynamic_batch_size=1,2")
    x = images(7, seed=11)
    comms = hccl.comm_init_all(list(range(4)))
    with load_sharded(str(om), comms, "batch") as model:
        got = model.execute([x])
    assert_close(got, h.onnxruntime(onnx_models["resnet18"], [x]))


@VISION
def test_output_type_and_fp16_inputs(atc, tmp_path, onnx_models, rt_local):
    om = convert(atc, tmp_path, onnx_models["resnet18"], "resnet18_fp16", "--input_shape=input:2,3,64,64",
                 "--input_fp16_nodes=input", "--output_type=FP16")
    from rt.mdl import format as fmt
    model = fmt.parse(om.read_bytes())
    assert [(v.name, str(v.dtype)) for v in model.inputs] == [("input", "float16")]
    assert [(v.name, str(v.dtype), v.shape) for v in model.outputs] == [("output", "float16", (2, 1000))]
    rt_local.set_device(0)
    x = images(2, seed=5).astype(np.float16)
    (got,) = h.on_card(rt_local, om, [x])
    (want,) = h.onnxruntime(onnx_models["resnet18"], [x.astype(np.float32)])
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2)


@VISION
def test_out_nodes_pick_an_inner_tensor(atc, tmp_path, onnx_models, rt_local):
    """--out_nodes="node:index" makes that node's output the model output (the features before the fc)."""
    import onnx
    graph = onnx.load(str(onnx_models["resnet18"])).graph
    flatten = next(n for n in graph.node if n.op_type == "Flatten")
    om = convert(atc, tmp_path, onnx_models["resnet18"], "features", "--input_shape=input:1,3,64,64",
                 f"--out_nodes={flatten.name}:0")
    from rt.mdl import format as fmt
    model = fmt.parse(om.read_bytes())
    assert [(v.name, v.shape) for v in model.outputs] == [(flatten.output[0], (1, 512))]


@h.needs_kernels("Conv", "Relu", "GlobalAveragePool")
def test_dynamic_image_size_runs_every_profile(atc, tmp_path, rt_local):
    import atc_models
    import torch
    from torch import nn
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    path = tmp_path / "fcn.onnx"
    atc_models.export(net, (torch.randn(1, 3, 32, 32),), path, ["image"], ["feat"],
                      axes={"image": {2: "height", 3: "width"}})
    om = convert(atc, tmp_path, path, "fcn", "--input_shape=image:1,3,-1,-1", "--dynamic_image_size=32,32;48,64")
    from rt.mdl import format as fmt
    model = fmt.parse(om.read_bytes())
    assert model.image_sizes == ((32, 32), (48, 64)) and model.inputs[0].shape == (1, 3, -1, -1)
    rt_local.set_device(0)
    for hw in ((32, 32), (48, 64)):
        x = np.random.default_rng(hw[1]).standard_normal((1, 3, *hw)).astype(np.float32)
        assert_close(h.on_card(rt_local, om, [x], dynamic_dims=True), h.onnxruntime(path, [x]))


@VISION
@pytest.mark.timeout(300)
def test_the_example_runs_end_to_end(tmp_path):
    """examples/atc_resnet.py: export, atc, the pyACL flow on one card, batch-sharded on 8, onnxruntime."""
    import os
    import subprocess
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("ASCEND_RT_VISIBLE_DEVICES", "RAY_ADDRESS")}
    env["NPUSIM_BACKEND"] = "local"
    done = subprocess.run([sys.executable, str(root / "examples" / "atc_resnet.py"), "--hw", "32", "--keep",
                           str(tmp_path)], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ATC run success, welcome to the next use." in done.stdout
    assert "sharded outputs == single-card outputs" in done.stdout
    assert "single-card outputs == onnxruntime" in done.stdout
    assert (tmp_path / "resnet18.om").read_bytes()[:20].find(b"npusim-om") > 0


@h.needs_kernels("Split", "Pad", "Resize", "Slice", "Expand", "Concat", "Sigmoid", "Clip", "ReduceMean", "Squeeze",
                 "Unsqueeze")
def test_layout_ops_of_exported_graphs_match_onnxruntime(atc, tmp_path, rt_local):
    """Split, Pad, Resize, strided Slice, Expand, Concat, Clip, ReduceMean, Squeeze/Unsqueeze: their parameter
    inputs (split, pads, scales, starts/ends/steps, shape, min/max, axes) become kernel attributes."""
    import atc_models
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Layout(nn.Module):
        def forward(self, x):
            a, b = torch.split(x, [1, 3], dim=1)
            y = F.interpolate(F.pad(b, (1, 1, 2, 0)), scale_factor=2, mode="nearest")
            y = y[:, :, 1:-1:2, ::2]
            z = torch.cat([a.expand(1, 3, 8, 8), torch.sigmoid(b)], 1)
            return y.mean(dim=(2, 3)), z.clamp(-0.5, 0.5), x.squeeze(0).unsqueeze(1)

    path = tmp_path / "layout.onnx"
    atc_models.export(Layout(), (torch.randn(1, 4, 8, 8),), path, ["x"], ["m", "z", "s"])
    om = convert(atc, tmp_path, path, "layout")
    rt_local.set_device(0)
    x = np.random.default_rng(2).standard_normal((1, 4, 8, 8)).astype(np.float32)
    assert_close(h.on_card(rt_local, om, [x]), h.onnxruntime(path, [x]), rtol=1e-5, atol=1e-6)


@h.needs_kernels("Erf", "LayerNormalization", "MatMul", "Softmax", "Unsqueeze")
def test_bert_through_the_pyacl_facade(atc, tmp_path, onnx_models, acl0):
    """acl.mdl as a pyACL program drives it: int64 token inputs in, both outputs out, sizes from the desc."""
    acl = acl0
    om = convert(atc, tmp_path, onnx_models["bert"], "bert_acl")
    model_id, ret = acl.mdl.load_from_file(str(om))
    assert ret == 0
    desc = acl.mdl.create_desc()
    assert acl.mdl.get_desc(desc, model_id) == 0
    assert [acl.mdl.get_input_name_by_index(desc, i) for i in range(2)] == ["input_ids", "attention_mask"]
    feeds = bert_feeds(2, seed=4)
    inputs, outputs, keep = acl.mdl.create_dataset(), acl.mdl.create_dataset(), []
    for i, x in enumerate(feeds):
        size = acl.mdl.get_input_size_by_index(desc, i)
        assert size == x.nbytes
        ptr, ret = acl.rt.malloc(size, 0)
        assert acl.rt.memcpy(ptr, size, acl.util.numpy_to_ptr(x), size, 1) == 0
        acl.mdl.add_dataset_buffer(inputs, acl.create_data_buffer(ptr, size))
    for i in range(acl.mdl.get_num_outputs(desc)):
        size = acl.mdl.get_output_size_by_index(desc, i)
        ptr, ret = acl.rt.malloc(size, 0)
        keep.append((ptr, size, acl.mdl.get_output_dims(desc, i)[0]["dims"]))
        acl.mdl.add_dataset_buffer(outputs, acl.create_data_buffer(ptr, size))
    assert acl.mdl.execute(model_id, inputs, outputs) == 0
    got = []
    for ptr, size, dims in keep:
        host = np.empty(dims, np.float32)
        assert acl.rt.memcpy(acl.util.numpy_to_ptr(host), size, ptr, size, 2) == 0
        got.append(host)
    assert_close(got, h.onnxruntime(onnx_models["bert"], feeds))
    assert acl.mdl.unload(model_id) == 0
