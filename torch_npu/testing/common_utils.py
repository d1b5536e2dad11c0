"""torch_npu.testing.common_utils: tensor factories and decorators of torch_npu's test files."""

from __future__ import annotations

import atexit
import json
import os
import threading
import unittest
from contextlib import contextmanager
from functools import wraps
from itertools import product

import numpy as np
import torch

import torch_npu

PERF_TEST_ENABLE = os.getenv("PERF_TEST_ENABLE", "").upper() in ("ON", "1", "YES", "TRUE", "Y")
PERF_BASELINE_FILE = os.path.realpath(os.getenv("PERF_BASELINE_FILE",
                                                os.path.join(os.getcwd(), "performance_baseline.json")))


@contextmanager
def freeze_rng_state():
    state = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(state)


def iter_indices(tensor):
    if tensor.dim() == 0:
        return range(0)
    if tensor.dim() == 1:
        return range(tensor.size(0))
    return product(*(range(s) for s in tensor.size()))


def is_iterable(obj) -> bool:
    try:
        iter(obj)
        return True
    except TypeError:
        return False


def get_npu_device() -> str:
    """``npu:$SET_NPU_DEVICE``, default ``npu:0``."""
    index = os.environ.get("SET_NPU_DEVICE")
    return "npu:0" if index is None else f"npu:{index}"


def set_npu_device() -> str:
    device = get_npu_device()
    torch.npu.set_device(device)
    return device


def create_common_tensor(item, minValue, maxValue, device=None):
    """``item = [numpy dtype, npu format, shape]``: the same uniform random data as a CPU tensor and an NPU tensor
    (cast to the format unless it is -1)."""
    device = get_npu_device() if device is None else device
    dtype, npu_format, shape = item[0], item[1], item[2]
    data = np.random.uniform(minValue, maxValue, shape).astype(dtype)
    cpu_input = torch.from_numpy(data)
    npu_input = torch.from_numpy(data).to(device)
    if npu_format != -1:
        npu_input = torch_npu.npu_format_cast(npu_input, npu_format)
    return cpu_input, npu_input


def create_dtype_tensor(shape, dtype, npu_format=-1, min_value=-5, max_value=5, no_zero=False, device=None):
    device = get_npu_device() if device is None else device
    if dtype == torch.bool:
        data = np.random.randint(0, 2, size=shape).astype(bool)
    elif dtype == torch.half:
        data = np.random.uniform(min_value, max_value, shape).astype(np.float16)
    elif dtype == torch.float:
        data = np.random.uniform(min_value, max_value, shape).astype(np.float32)
    else:
        data = np.random.randint(min_value, max_value + 1, size=shape).astype(np.int32)
    if no_zero:
        data = np.where(data != 0, data, np.ones_like(data))
    cpu_input = torch.from_numpy(data)
    npu_input = torch.from_numpy(data).to(device)
    if npu_format != -1 and dtype in (torch.float, torch.half):
        npu_input = torch_npu.npu_format_cast(npu_input, npu_format)
    return cpu_input, npu_input


def _broadcast_cases(device=None):
    device = get_npu_device() if device is None else device
    for xs, ys in (((2, 3, 4, 5), (1, 1, 1)), ((2, 3, 4, 5), (4, 5))):
        x = np.random.rand(*xs).astype(np.float32)
        y = np.random.rand(*ys).astype(np.float32)
        yield torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)


def test_2args_broadcast(fn):
    """``[[cpu result, npu result], ...]`` of ``fn`` over broadcasting argument pairs."""
    return [[fn(cx, cy).numpy(), fn(nx, ny).to("cpu").numpy()] for cx, cy, nx, ny in _broadcast_cases()]


test_2args_broadcast.__test__ = False              # a helper, not a test, for pytest


def check_operators_in_prof(expected_operators, prof, unexpected_operators=None):
    """True if every expected operator (and no unexpected one) appears in a torch profiler's results."""
    unexpected = unexpected_operators or []
    averages = prof.key_averages()
    if not averages:
        print("torch profiling is empty, please check it")
        return None
    for item in averages:
        key = item.key.replace("cached_", "")
        if key in unexpected:
            return False
        if key in expected_operators:
            expected_operators.remove(key)
    return not expected_operators


class SkipIfNoLapack:
    def __call__(self, fn):
        @wraps(fn)
        def wrapper(*args, **kwargs):
            if not torch._C.has_lapack:
                raise unittest.SkipTest("PyTorch compiled without Lapack")
            return fn(*args, **kwargs)
        return wrapper


class SupportedDevices:
    """Run a test only on the listed SoCs (``["Ascend910B"]``...), matched on the device name's prefix as
    torch_npu matches it; npusim's cards report the config's SoC (``Ascend910B1`` by default)."""

    def __init__(self, supported_devices):
        self.supported_devices = supported_devices

    def __call__(self, fn):
        @wraps(fn)
        def dep_fn(slf, *args, **kwargs):
            name = torch_npu.npu.get_device_name(0)
            short = name[:10]
            if short == "Ascend910_":
                short = name[:12]
            elif short.startswith("Ascend950"):
                short = name[:9]
            if short not in self.supported_devices:
                raise unittest.SkipTest(f"Only run on {self.supported_devices!r}, current device is {short}.")
            return fn(slf, *args, **kwargs)
        return dep_fn


class Baseline:
    """Per-test run-time baselines (``PERF_TEST_ENABLE``), kept in ``PERF_BASELINE_FILE``."""

    def __init__(self, path: str):
        self._path = path
        self._baseline = {}
        self._mutex = threading.Lock()
        if os.path.exists(path):
            with open(path) as f:
                self._baseline = json.load(f)

    def get_baseline(self, resource_id):
        return self._baseline.get(resource_id)

    def set_baseline(self, resource_id, value):
        with self._mutex:
            self._baseline[resource_id] = value

    def save_baseline(self):
        with self._mutex, open(self._path, "w") as f:
            json.dump(self._baseline, f)


PerfBaseline = Baseline(PERF_BASELINE_FILE)
if PERF_TEST_ENABLE:
    atexit.register(PerfBaseline.save_baseline)


def _create_scaling_models_optimizers(device="npu", optimizer_ctor=torch.optim.SGD, optimizer_kwargs=None):
    """A model + optimizer to scale and an identical control pair (torch's GradScaler test helper)."""
    mod_control = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(device=device)
    mod_scaling = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(device=device)
    with torch.no_grad():
        for c, s in zip(mod_control.parameters(), mod_scaling.parameters()):
            s.copy_(c)
    kwargs = {"lr": 1.0, **(optimizer_kwargs or {})}
    return (mod_control, mod_scaling, optimizer_ctor(mod_control.parameters(), **kwargs),
            optimizer_ctor(mod_scaling.parameters(), **kwargs))


def _create_scaling_case(device="npu", dtype=torch.float, optimizer_ctor=torch.optim.SGD, optimizer_kwargs=None):
    data = [(torch.randn((8, 8), dtype=dtype, device=device), torch.randn((8, 8), dtype=dtype, device=device))
            for _ in range(4)]
    loss_fn = torch.nn.MSELoss().npu()
    return _create_scaling_models_optimizers(device, optimizer_ctor, optimizer_kwargs) + (data, loss_fn, 2)
