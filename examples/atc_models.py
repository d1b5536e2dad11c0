"""Torch models for the atc example and tests, written out here (torchvision is not a dependency of npusim):
ResNet-18 and MobileNetV2 with torchvision's layer layout, and a small BERT-style encoder, plus ``export``
(``torch.onnx.export`` as ATC users call it). Weights are random; nothing is downloaded."""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn
from torch.nn import functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """torchvision's resnet18: 7x7 stem, max pool, four stages of two basic blocks, global pool, fc."""

    def __init__(self, classes: int = 1000, width: int = 64):
        super().__init__()
        w = width
        self.conv1 = nn.Conv2d(3, w, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], w
        for i, cout in enumerate((w, 2 * w, 4 * w, 8 * w)):
            stride = 1 if i == 0 else 2
            stages += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.avgpool(self.layers(x))
        return self.fc(torch.flatten(x, 1))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden),
                   nn.ReLU6(), nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's mobilenet_v2 layout (width multiplier ``alpha``): depthwise convs, ReLU6 (Clip), residuals."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))

    def __init__(self, classes: int = 1000, alpha: float = 1.0):
        super().__init__()
        c = lambda n: max(8, int(n * alpha + 4) // 8 * 8)
        cin = c(32)
        layers = [nn.Conv2d(3, cin, 3, 2, 1, bias=False), nn.BatchNorm2d(cin), nn.ReLU6()]
        for t, ch, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c(ch), s if i == 0 else 1, t))
                cin = c(ch)
        last = c(1280) if alpha > 1 else 1280
        layers += [nn.Conv2d(cin, last, 1, bias=False), nn.BatchNorm2d(last), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, classes))

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


class EncoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ff: int):
        super().__init__()
        self.heads, self.dh = heads, d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def split(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.dh).transpose(1, 2)

    def forward(self, x, bias):
        b, s, d = x.shape
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.dh) + bias, dim=-1)
        ctx = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = self.ln1(x + self.o(ctx))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class TinyBert(nn.Module):
    """A BERT-style encoder: token + position embeddings, attention-mask bias, N post-LN layers, pooled [CLS]."""

    def __init__(self, vocab: int = 1000, d: int = 64, heads: int = 4, ff: int = 128, layers: int = 2, seq: int = 16):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.ln = nn.LayerNorm(d)
        self.layers = nn.ModuleList(EncoderLayer(d, heads, ff) for _ in range(layers))
        self.pool = nn.Linear(d, d)

    def forward(self, input_ids, attention_mask):
        s = input_ids.shape[1]
        pos = torch.arange(s, device=input_ids.device).unsqueeze(0)
        x = self.ln(self.tok(input_ids) + self.pos(pos))
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, bias)
        return x, torch.tanh(self.pool(x[:, 0]))


def export(model: nn.Module, args: tuple, path, input_names, output_names, dynamic_batch: bool = False,
           opset: int = 17, axes: dict | None = None) -> None:
    """torch.onnx.export with the TorchScript exporter (dynamo=False), as most ATC users still export;
    ``dynamic_batch`` marks dim 0 of every input and output dynamic, ``axes`` gives dynamic_axes directly."""
    model.eval()
    if dynamic_batch:
        axes = {n: {0: "batch"} for n in (*input_names, *output_names)}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the TorchScript exporter is deprecated (still common) and chatty
        torch.onnx.export(model, args, str(path), input_names=list(input_names), output_names=list(output_names),
                          opset_version=opset, dynamic_axes=axes, dynamo=False)


def randomize_bn(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give BatchNorm layers non-trivial running statistics, so folding them is really tested."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model
