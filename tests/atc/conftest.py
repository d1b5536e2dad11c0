"""Fixtures of the atc tests: ONNX exports of the test models (made once per session, in a temporary
directory) and a function running the ``atc`` command line in-process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="session")
def onnx_models(tmp_path_factory):
    """Paths of the exported test models: resnet18 (dynamic batch axis), mobilenetv2, bert (static), bert_dyn."""
    import torch
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    import atc_models as models
    d = tmp_path_factory.mktemp("onnx")
    torch.manual_seed(0)
    img = torch.randn(1, 3, 64, 64)
    ids = torch.randint(0, 1000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    out = {}
    out["resnet18"] = d / "resnet18.onnx"
    models.export(models.randomize_bn(models.ResNet18()), (img,), out["resnet18"], ["input"], ["output"],
                  dynamic_batch=True)
    out["mobilenetv2"] = d / "mobilenetv2.onnx"
    models.export(models.randomize_bn(models.MobileNetV2(alpha=0.5)), (img,), out["mobilenetv2"], ["input"], ["output"])
    bert = models.TinyBert()
    out["bert"] = d / "bert.onnx"
    models.export(bert, (ids, mask), out["bert"], ["input_ids", "attention_mask"], ["last_hidden", "pooled"])
    out["bert_dyn"] = d / "bert_dyn.onnx"
    models.export(bert, (ids, mask), out["bert_dyn"], ["input_ids", "attention_mask"], ["last_hidden", "pooled"],
                  dynamic_batch=True)
    return out


@pytest.fixture
def atc(capsys):
    """``atc(*flags) -> (exit status, stdout)``: the console script's main, in this process."""
    from launcher.tools.atc import main

    def run(*argv):
        capsys.readouterr()
        status = main([str(a) for a in argv])
        return status, capsys.readouterr().out
    return run
