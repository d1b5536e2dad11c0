"""Resizing npu storages (``hooks.cpp``'s ``resizePrivateUse1Bytes``), as CPU torch resizes CPU ones: the bytes kept
as far as both sizes reach, every view of the storage on the new memory, the caching allocator's accounting
following (resize to 0 frees the block, a resize up takes one, a refused one raises torch_npu's out-of-memory error
and leaves the storage as it was). Then what is built on it: ``Tensor.resize_``, ``out=`` tensors of the wrong
size, ``param.data`` moved between npu and CPU, and FSDP1/FSDP2 training under ``launch --nproc 2``."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch_npu  # noqa: F401,E402  - registers the npu device

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).with_name("scripts")


def _allocated():
    return torch.npu.memory_allocated(0)


@pytest.mark.parametrize("device", ["npu", "cpu"])
def test_storage_resize_keeps_the_bytes_both_sizes_reach(device):
    t = torch.arange(10, dtype=torch.float32, device=device)
    view = t[2:5]
    store = t.untyped_storage()
    store.resize_(80)
    assert store.nbytes() == 80 and t.untyped_storage().nbytes() == 80
    assert view.untyped_storage().data_ptr() == store.data_ptr()     # one storage: every view on the new bytes
    assert t.tolist() == [float(i) for i in range(10)] and view.tolist() == [2., 3., 4.]
    store.resize_(12)
    assert torch.empty(0, device=device).set_(store, 0, (3,), (1,)).tolist() == [0., 1., 2.]
    store.resize_(0)
    assert store.nbytes() == 0 and t.untyped_storage().nbytes() == 0
    store.resize_(40)
    t.copy_(torch.arange(10.) * 2)
    assert view.tolist() == [4., 6., 8.]


def test_storage_resize_to_zero_frees_the_block_and_resize_up_takes_one():
    torch.npu.empty_cache()
    before = _allocated()
    t = torch.ones(1000, device="npu")
    assert _allocated() == before + 4000
    t.untyped_storage().resize_(0)
    assert _allocated() == before
    t._typed_storage()._resize_(1000)                 # FSDP1's call (TypedStorage counts elements)
    assert _allocated() == before + 4000
    t.untyped_storage().resize_(3 << 20)              # a large-pool block
    assert _allocated() == before + (3 << 20)
    assert torch.npu.memory_stats(0)["allocated_bytes.large_pool.current"] >= 3 << 20
    t.untyped_storage().resize_(0)
    assert _allocated() == before
    del t
    torch.npu.empty_cache()
    assert _allocated() == before


def test_a_resize_the_card_refuses_raises_and_leaves_the_storage():
    t = torch.arange(4., device="npu")
    before = _allocated()
    capacity = torch.npu.get_device_properties(0).total_memory
    with pytest.raises(torch.OutOfMemoryError, match="NPU out of memory. Tried to allocate"):
        t.untyped_storage().resize_(2 * capacity)
    assert t.untyped_storage().nbytes() == 16 and t.tolist() == [0., 1., 2., 3.]
    assert _allocated() == before


@pytest.mark.parametrize("device", ["npu", "cpu"])
def test_tensor_resize_grows_the_storage_its_views_share(device):
    t = torch.arange(4., device=device)
    view = t.view(2, 2)
    t.resize_(3, 3)
    assert t.shape == (3, 3) and t.untyped_storage().nbytes() == 36
    assert view.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    assert t.reshape(-1)[:4].tolist() == [0., 1., 2., 3.]
    t.resize_(0)
    assert t.shape == (0,) and t.untyped_storage().nbytes() == 36    # shrinking keeps the storage, as on CPU


def _with_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message).split(" (Triggered")[0] for w in caught if "resized" in str(w.message)]


@pytest.mark.parametrize("make", [
    lambda d, out: torch.add(torch.arange(6., device=d), 1, out=out),
    lambda d, out: torch.mm(torch.ones(2, 3, device=d), torch.ones(3, 4, device=d), out=out),
    lambda d, out: torch.cat([torch.ones(2, device=d), torch.zeros(5, device=d)], out=out),
    lambda d, out: torch.sum(torch.ones(4, 3, device=d), 0, out=out),
], ids=["add", "mm", "cat", "sum"])
@pytest.mark.parametrize("out_shape", [(0,), (3,), (2, 5), (40,)], ids=str)
def test_out_tensors_of_the_wrong_size_are_resized_as_on_cpu(make, out_shape):
    results = {}
    for device in ("npu", "cpu"):
        out = torch.full(out_shape, 9., device=device)
        alias = out.view(-1)
        result, caught = _with_warnings(lambda: make(device, out))
        assert result is out
        assert alias.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()   # resized in place
        results[device] = (out.shape, out.stride(), out.cpu().tolist(), caught, out.untyped_storage().nbytes())
    assert results["npu"] == results["cpu"]


def test_an_out_view_of_the_right_size_is_written_in_place():
    for device in ("npu", "cpu"):
        base = torch.zeros(3, 4, device=device)
        torch.add(torch.ones(3, 2, device=device), 1, out=base[:, ::2])
        assert base.cpu().tolist() == [[2., 0., 2., 0.]] * 3


def test_parameter_data_moves_between_npu_and_cpu_as_on_torch_npu():
    p = torch.nn.Parameter(torch.arange(3., device="npu"))
    p.data = p.data.cpu()                             # FSDP's offload_to_cpu
    assert p.device.type == "cpu" and isinstance(p, torch.nn.Parameter) and p.tolist() == [0., 1., 2.]
    p.data = p.data.to("npu:0")
    assert p.device == torch.device("npu", 0)
    q = torch.ones(2, device="npu")
    with pytest.raises(RuntimeError, match="incompatible tensor type"):
        q.data = torch.ones(2, device="meta")


def _env():
    keep = ("NPUSIM_BACKEND", "ASCEND_RT_VISIBLE_DEVICES", "RAY_ADDRESS", "MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE",
            "RANK", "LOCAL_RANK", "NPUSIM_CARD_DIR")
    return {k: v for k, v in os.environ.items() if k not in keep}


@pytest.mark.timeout(300)
def test_fsdp1_and_fsdp2_train_on_npu_as_plain_training_on_the_global_batch():
    done = subprocess.run([sys.executable, "-m", "launcher", "--nproc", "2", str(SCRIPTS / "fsdp_train.py")],
                          check=False, capture_output=True, text=True, env=_env(), timeout=280, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    for rank in (0, 1):
        for mode in ("full_shard", "shard_grad_op", "fully_shard"):
            assert f"rank {rank} {mode} OK" in done.stdout, done.stdout[-2000:]
