"""The ``torch.npu`` API torch_npu scripts call — devices, properties, streams and events on the card, RNG,
amp, options — in one process with in-process cards (``rt_local``), and under ``launch``; the oracles are the
runtime's own answers (``rt.get_mem_info``, ``rt.get_device_info``), the card's clock, and the same computation
in float32 on CPU."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch_npu
from torch_npu import _runtime

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def npu(rt_local):
    torch.npu.set_device(0)
    yield rt_local
    torch.npu.set_device(0)


def test_device_management(npu):
    assert torch.npu.is_available() and torch.npu.device_count() == 8
    assert torch.npu.is_initialized()
    torch.npu.init()
    torch.npu.set_device("npu:1")
    assert torch.npu.current_device() == 1
    with torch.npu.device(3):
        assert torch.npu.current_device() == 3
        with torch.npu.device(None):
            assert torch.npu.current_device() == 3
    assert torch.npu.current_device() == 1
    t = torch.zeros(2, device="npu:2")
    with torch.npu.device_of(t):
        assert torch.npu.current_device() == 2 and torch.zeros(1, device="npu").device.index == 2
    with torch.npu.device_of(torch.zeros(2)):         # a CPU tensor: no-op
        assert torch.npu.current_device() == 1
    torch.npu.set_device(torch.device("npu", 0))
    with pytest.raises(RuntimeError, match="invalid device 8"):
        torch.npu.set_device(8)
    with pytest.raises(ValueError, match="Expected a npu device, but got: cpu"):
        torch.npu.device("cpu")
    torch.npu.synchronize()
    torch.npu.synchronize(2)


def test_device_properties_are_the_cards(npu):
    props = torch.npu.get_device_properties(1)
    info = npu.get_device_info(1)
    assert props.name == info.soc_name == torch.npu.get_device_name(1) == "Ascend910B1"
    assert props.total_memory == info.total_memory == 2 << 30
    assert (props.cube_core_num, props.vector_core_num) == (24, 48)
    assert repr(props).startswith("_NPUDeviceProperties(name='Ascend910B1', total_memory=2048MB, cube_core_num=24")
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.npu.get_device_properties(8)
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.npu.get_device_name(-1)
    assert torch.npu.is_bf16_supported()
    assert torch.npu.can_device_access_peer(0, 1) and not torch.npu.can_device_access_peer(1, 1)


def test_device_capability_follows_torch_npu(npu, monkeypatch):
    monkeypatch.delenv("TORCH_NPU_DEVICE_CAPABILITY", raising=False)
    with pytest.warns(UserWarning, match="TORCH_NPU_DEVICE_CAPABILITY"):
        assert torch.npu.get_device_capability() is None
    monkeypatch.setenv("TORCH_NPU_DEVICE_CAPABILITY", "8.0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.npu.get_device_capability(0) == (8, 0)


def test_mem_get_info_is_the_cards_answer(npu):
    torch.npu.empty_cache()
    free, total = torch.npu.mem_get_info(2)
    reserved = torch.npu.memory_reserved(2)
    with _runtime.on(2):
        assert (free, total) == npu.get_mem_info() and total == 2 << 30
    t = torch.empty(1 << 18, device="npu:2")                  # 1 MiB: a 2 MiB segment reserved on card 2
    assert torch.npu.mem_get_info(2)[0] == free - (2 << 20) == free - (torch.npu.memory_reserved(2) - reserved)
    assert torch.npu.memory_allocated(2) >= 1 << 20
    del t
    torch.npu.empty_cache()
    assert torch.npu.mem_get_info(2)[0] == free


def test_streams_and_current_stream(npu):
    default = torch.npu.default_stream()
    assert isinstance(default, torch.Stream) and default.device == torch.device("npu", 0)
    assert default.npu_stream == 0 and torch.npu.current_stream() == default
    s = torch.npu.Stream()
    assert s != default and s.device_type == 20 and s.device_index == 0
    assert torch.npu.Stream(stream_id=s.stream_id, device_index=0, device_type=20) is s
    with torch.npu.stream(s):
        assert torch.npu.current_stream() == s
    assert torch.npu.current_stream() == default
    s2 = torch.npu.Stream(device=2)
    assert s2.device == torch.device("npu", 2)
    with torch.npu.stream(s2):                        # another device's stream: that device's current stream
        assert torch.npu.current_stream(2) == s2 and torch.npu.current_stream() == default
    assert torch.npu.current_stream(2) == torch.npu.default_stream(2)
    with s:                                           # a stream is its own context manager, as in torch
        assert torch.npu.current_stream() is s
    assert torch.npu.current_stream() == default
    torch.npu.set_stream(s)
    try:
        assert torch.npu.current_stream() is s
    finally:
        torch.npu.set_stream(default)
    assert s.query() and s.synchronize() is None
    with pytest.raises(RuntimeError, match="Stream.get_priority"):
        _ = s.priority


def test_events_order_and_time_the_cards_streams(npu):
    s1, s2 = torch.npu.Stream(), torch.npu.Stream()
    start = torch.npu.Event(enable_timing=True)
    end = torch.npu.Event(enable_timing=True)
    assert start.query() and repr(start) == "<torch_npu.npu.Event uninitialized>"
    start.record(s1)
    with _runtime.on(0):
        npu.sleep_kernel(0.3, s1._rt)                 # a 300 ms kernel on s1
    end.record(s1)
    assert not s1.query() and not end.query()
    s2.wait_event(end)                                # s2's next work waits for s1's kernel
    after = s2.record_event()
    after.synchronize()
    assert end.query() and s1.query()
    assert 250 <= start.elapsed_time(end) <= 3000
    s3 = torch.npu.Stream()
    s3.wait_stream(s1)
    s3.synchronize()
    with pytest.raises(RuntimeError, match="Both events must be recorded before calculating elapsed time"):
        start.elapsed_time(torch.npu.Event(enable_timing=True))
    plain, plain2 = torch.npu.Event(), torch.npu.Event()
    plain.record()
    plain2.record()
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        plain.elapsed_time(plain2)
    other = torch.npu.Stream(device=1)
    with pytest.raises(RuntimeError, match="Event device 0 does not match recording stream's device 1"):
        start.record(other)


def test_rng_is_torchs_generator_and_repeats(npu):
    torch.npu.manual_seed(5)
    assert torch.npu.initial_seed() == 5
    a = torch.randn(4, device="npu")
    state = torch.npu.get_rng_state()
    b = torch.randn(4, device="npu")
    torch.npu.manual_seed_all(5)
    assert torch.equal(torch.randn(4, device="npu").cpu(), a.cpu())
    torch.npu.set_rng_state(state)
    assert torch.equal(torch.randn(4, device="npu").cpu(), b.cpu())
    assert len(torch.npu.get_rng_state_all()) == torch.npu.device_count()
    torch.npu.set_rng_state_all(torch.npu.get_rng_state_all())
    torch.npu.seed()
    torch.npu.seed_all()
    torch.manual_seed(7)                              # torch seeds the device module too
    assert torch.npu.initial_seed() == 7


def test_autocast_casts_npu_ops_like_cuda(npu):
    x = torch.randn(8, 16, device="npu")
    w = torch.randn(16, 4, device="npu")
    with torch.npu.amp.autocast():
        y = x @ w
        p = torch.softmax(y, dim=-1)
    assert y.dtype == torch.float16 and p.dtype == torch.float32 and y.device.type == "npu"
    assert torch.allclose(y.float().cpu(), x.cpu() @ w.cpu(), atol=5e-2, rtol=1e-2)
    with torch.autocast("npu", dtype=torch.bfloat16):
        z = torch.nn.functional.linear(x, w.t())
        assert torch.npu.is_autocast_enabled() and torch.npu.get_autocast_dtype() == torch.bfloat16
    assert z.dtype == torch.bfloat16 and not torch.npu.is_autocast_enabled()
    assert (x @ w).dtype == torch.float32


def test_grad_scaler_trains_like_unscaled_and_skips_inf(npu):
    from torch_npu.npu.amp import GradScaler
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 1)
    model = torch.nn.Linear(4, 1).npu()
    model.load_state_dict(ref.state_dict())
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler(init_scale=1024.0)
    data = torch.randn(16, 4)
    for _ in range(3):
        opt_ref.zero_grad()
        ref(data).pow(2).mean().backward()
        opt_ref.step()
        opt.zero_grad()
        scaler.scale(model(data.npu()).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
    assert torch.allclose(model.weight.detach().cpu(), ref.weight.detach(), atol=1e-5)
    before = model.weight.detach().cpu().clone()
    opt.zero_grad()
    scaler.scale(model(data.npu()).sum() * float("inf")).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(model.weight.detach().cpu(), before) and scaler.get_scale() == 512.0
    with pytest.raises(ValueError, match="The growth factor must be > 1.0."):
        GradScaler(growth_factor=1.0)
    static = GradScaler(init_scale=8.0, dynamic=False)
    opt.zero_grad()
    static.scale(model(data.npu()).sum() * float("inf")).backward()
    static.step(opt)
    static.update()
    assert static.get_scale() == 8.0


def test_options_are_accepted_and_validated(npu):
    torch.npu.set_compile_mode(jit_compile=False)
    assert torch.npu.is_jit_compile_false()
    torch.npu.set_option({"ACL_PRECISION_MODE": "must_keep_origin_dtype", "ACL_OP_COMPILER_CACHE_MODE": "enable"})
    with pytest.raises(ValueError, match="value of ACL_PRECISION_MODE should be in"):
        torch.npu.set_option({"ACL_PRECISION_MODE": "fast"})
    with pytest.raises(TypeError, match="npu option must be a dict."):
        torch.npu.set_option(["x"])
    torch.npu.config.allow_internal_format = False
    torch.npu.matmul.allow_hf32 = True
    assert torch.npu.matmul.allow_hf32 and torch.npu.conv.allow_hf32
    with pytest.raises(TypeError, match="allow_hf32 must be a bool, but got str"):
        torch.npu.matmul.allow_hf32 = "yes"


def test_a_rank_without_its_cards_yet_is_told_to_init_the_process_group(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("NPUSIM_CARD_DIR", "NPUSIM_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="call it before using NPU streams"):
        torch.npu.Stream()
    assert not torch.npu.is_initialized()
    assert torch_npu.npu.is_available()


JOB = '''
import os
import torch
import torch.distributed as dist
import torch_npu

rank = int(os.environ["LOCAL_RANK"])
torch.npu.set_device(rank)
dist.init_process_group("hccl")
s = torch.npu.Stream()
start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
start.record(s)
with torch.npu.stream(s):
    x = torch.ones(1024, device="npu") * (rank + 1)
end.record(s)
end.synchronize()
dist.all_reduce(x)
torch.npu.synchronize()
free, total = torch.npu.mem_get_info()
with torch.npu.amp.autocast():
    y = torch.randn(4, 4, device="npu") @ torch.randn(4, 4, device="npu")
print("ok", rank, x[0].item(), s.device, start.elapsed_time(end) >= 0, total, free <= total, y.dtype, flush=True)
dist.destroy_process_group()
'''


def test_streams_events_memory_and_amp_under_launch(tmp_path):
    """The same calls on Ray-hosted cards reached over their sockets (``launch``), next to an hccl all_reduce."""
    script = tmp_path / "api_job.py"
    script.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k not in ("NPUSIM_BACKEND", "ASCEND_RT_VISIBLE_DEVICES",
                                                            "MASTER_PORT", "MASTER_ADDR", "NPUSIM_CARD_DIR")}
    done = subprocess.run([sys.executable, "-m", "launcher", "--nproc", "2", str(script)], capture_output=True,
                          text=True, env=env, cwd=Path(__file__).resolve().parents[2], timeout=110, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in (0, 1):
        assert f"[rank{rank}]:ok {rank} 3.0 npu:{rank} True 2147483648 True torch.float16" in done.stdout
