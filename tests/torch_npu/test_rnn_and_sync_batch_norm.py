"""Operators torch calls only on accelerators (torch_npu/accelerator_ops.py): the fused LSTM/GRU cells behind
``nn.LSTM``/``nn.GRU``/``nn.LSTMCell``/``nn.GRUCell`` on npu, and the ``batch_norm_*`` statistics operators behind
``nn.SyncBatchNorm`` (under ``launch --nproc 2``, against plain BatchNorm over the global batch). Also: structured
operators with a reduction (``mse_loss`` 'mean') take CPU torch's own path, without its resize warning.
Oracle: CPU torch."""

import copy
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch_npu  # noqa: F401  - registers the npu device

nn, F = torch.nn, torch.nn.functional
ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
pytestmark = pytest.mark.timeout(150)


def _flat(value):
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return [value]


def _npu(value):
    return tuple(_npu(v) for v in value) if isinstance(value, tuple) else value.npu()


def _forward_backward_match(module, x, state=None, tol=1e-5):
    module.zero_grad(set_to_none=True)                       # a deepcopy's parameters come without .grad
    ref, dev = module, copy.deepcopy(module).npu()
    want = ref(x) if state is None else ref(x, state)
    got = dev(x.npu()) if state is None else dev(x.npu(), _npu(state))
    for a, b in zip(_flat(want), _flat(got), strict=True):
        assert b.device.type == "npu"
        torch.testing.assert_close(b.cpu(), a, rtol=tol, atol=tol)
    weights = [torch.randn(t.shape) for t in _flat(want)]       # a loss that weighs every output differently
    sum((t * w).sum() for t, w in zip(_flat(want), weights)).backward()
    sum((t * w.npu()).sum() for t, w in zip(_flat(got), weights)).backward()
    for (name, p), q in zip(ref.named_parameters(), dev.parameters(), strict=True):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=10 * tol, atol=10 * tol, msg=name)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("layers,bidirectional,batch_first,bias",
                         [(1, False, False, True), (2, True, True, True), (2, False, False, False)])
def test_rnn_layers_match_cpu(kind, layers, bidirectional, batch_first, bias):
    torch.manual_seed(0)
    module = getattr(nn, kind)(5, 7, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first,
                               bias=bias)
    x = torch.randn(3, 4, 5)
    _forward_backward_match(module, x)
    directions = 2 if bidirectional else 1
    h0 = torch.randn(layers * directions, 3 if batch_first else 4, 7)
    _forward_backward_match(module, x, (h0, torch.randn_like(h0)) if kind == "LSTM" else h0)


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell"])
@pytest.mark.parametrize("bias", [True, False])
def test_rnn_cells_match_cpu(kind, bias):
    torch.manual_seed(1)
    module = getattr(nn, kind)(6, 4, bias=bias)
    x = torch.randn(3, 6)
    _forward_backward_match(module, x)
    h = torch.randn(3, 4)
    _forward_backward_match(module, x, (h, torch.randn(3, 4)) if kind == "LSTMCell" else h)


def test_lstm_cell_gradient_of_the_cell_state_alone():
    torch.manual_seed(2)
    cell, x = nn.LSTMCell(3, 5), torch.randn(2, 3)
    dev = copy.deepcopy(cell).npu()
    cell(x)[1].sum().backward()                       # only cy: grad_hy is undefined in the fused backward
    dev(x.npu())[1].sum().backward()
    for p, q in zip(cell.parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-6)


def test_rnn_double_backward_matches_cpu():
    torch.manual_seed(3)
    cell, x = nn.GRUCell(3, 4), torch.randn(2, 3, requires_grad=True)
    dev, xd = copy.deepcopy(cell).npu(), x.detach().npu().requires_grad_()
    (gx,) = torch.autograd.grad(cell(x).pow(2).sum(), x, create_graph=True)
    (gd,) = torch.autograd.grad(dev(xd).pow(2).sum(), xd, create_graph=True)
    torch.testing.assert_close(gd.cpu(), gx, rtol=1e-5, atol=1e-6)
    gx.sum().backward(), gd.sum().backward()
    torch.testing.assert_close(dev.weight_hh.grad.cpu(), cell.weight_hh.grad, rtol=1e-4, atol=1e-5)


class _Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.lstm = nn.LSTM(8, 16, num_layers=2, bidirectional=True, batch_first=True, dropout=0.0)
        self.gru = nn.GRU(32, 8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        out, _ = self.gru(out)
        return self.head(out)


def test_training_an_rnn_with_adam_matches_cpu():
    torch.manual_seed(4)
    ref = _Tagger()
    dev = copy.deepcopy(ref).npu()
    opt_ref, opt_dev = torch.optim.Adam(ref.parameters(), lr=1e-2), torch.optim.Adam(dev.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(5)
    for _ in range(4):
        tokens, labels = torch.randint(0, 11, (4, 6), generator=g), torch.randint(0, 3, (4, 6), generator=g)
        for model, opt, t, y in ((ref, opt_ref, tokens, labels), (dev, opt_dev, tokens.npu(), labels.npu())):
            opt.zero_grad()
            loss = F.cross_entropy(model(t).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
        assert dev.head.weight.device.type == "npu"
    for (name, p), q in zip(ref.named_parameters(), dev.parameters(), strict=True):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5, msg=name)


def test_batch_norm_statistics_operators_match_batch_norm():
    """The operators of SyncBatchNorm in one process: stats of two slices gathered give BatchNorm's result."""
    torch.manual_seed(6)
    x = torch.randn(10, 3, 4, 4, requires_grad=True)
    w, b = torch.randn(3), torch.randn(3)
    rm, rv = torch.zeros(3), torch.ones(3)
    want = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
    dy = torch.randn_like(want)
    gx, gw, gb = torch.autograd.grad(want, (x, ), dy)[0], *torch.autograd.grad(
        F.batch_norm(x.detach(), None, None, w.requires_grad_(), b.requires_grad_(), training=True), (w, b), dy)

    xd, wd, bd, dyd = x.detach().npu(), w.detach().npu(), b.detach().npu(), dy.npu()
    rmd, rvd = torch.zeros(3, device="npu"), torch.ones(3, device="npu")
    parts = [torch.batch_norm_stats(xd[:6], 1e-5), torch.batch_norm_stats(xd[6:], 1e-5)]
    counts = torch.tensor([6.0 * 16, 4.0 * 16], device="npu")
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        xd, torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]), rmd, rvd, 0.1, 1e-5, counts)
    assert mean.device.type == "npu"
    torch.testing.assert_close(rmd.cpu(), rm), torch.testing.assert_close(rvd.cpu(), rv)
    y = torch.batch_norm_elemt(xd, wd, bd, mean, invstd, 1e-5)
    torch.testing.assert_close(y.cpu(), want.detach(), rtol=1e-5, atol=1e-5)

    sum_dy, sum_dy_xmu, grad_w, grad_b = torch.batch_norm_backward_reduce(dyd, xd, mean, invstd, wd, True, True, True)
    torch.testing.assert_close(grad_w.cpu(), gw, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_b.cpu(), gb, rtol=1e-5, atol=1e-5)
    grad_x = torch.batch_norm_backward_elemt(dyd, xd, mean, invstd, wd, sum_dy, sum_dy_xmu,
                                             torch.tensor([96, 64], dtype=torch.int32, device="npu"))
    torch.testing.assert_close(grad_x.cpu(), gx, rtol=1e-5, atol=1e-5)
    none = torch.batch_norm_backward_reduce(dyd, xd, mean, invstd, wd, False, False, True)
    assert none[0] is None and none[1] is None and none[2] is None and none[3] is not None


def _env():
    keep = ("NPUSIM_BACKEND", "ASCEND_RT_VISIBLE_DEVICES", "RAY_ADDRESS", "MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE",
            "RANK", "LOCAL_RANK", "NPUSIM_CARD_DIR")
    return {k: v for k, v in os.environ.items() if k not in keep}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("args", [[], ["--empty"]], ids=["uneven", "empty-rank"])
def test_sync_batch_norm_under_ddp_matches_batch_norm_over_the_global_batch(args):
    done = subprocess.run([sys.executable, "-m", "launcher", "--nproc", "2", str(SCRIPTS / "sync_batch_norm.py"),
                           *args], check=False, capture_output=True, text=True, env=_env(), timeout=180, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "rank 0 OK" in done.stdout and "rank 1 OK" in done.stdout, done.stdout[-2000:]


@pytest.mark.parametrize("loss", [F.mse_loss, F.smooth_l1_loss, F.l1_loss, F.huber_loss])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_reducing_losses_match_cpu_without_a_resize_warning(loss, reduction):
    a, b = torch.randn(64, 1), torch.randn(64, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = loss(a.npu(), b.npu(), reduction=reduction)
    assert got.device.type == "npu" and got.shape == loss(a, b, reduction=reduction).shape
    torch.testing.assert_close(got.cpu(), loss(a, b, reduction=reduction))

