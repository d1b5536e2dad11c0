"""``torch_npu.testing``: a test file written the way torch_npu's own tests are (unittest ``TestCase``,
``create_common_tensor``, ``SupportedDevices``, ``@Dtypes``/``@Formats``, a 2-process ``"hccl"`` all_reduce
started with ``torch.multiprocessing`` under ``skipIfUnsupportMultiNPU(2)``, ``run_tests()`` at the bottom) runs
unchanged under ``python file.py`` and ``python -m pytest``; its multi-NPU test runs (8 simulated cards), and
its all_reduce result is checked against the sum computed on the CPU. A file built on torch's
``MultiProcessTestCase`` with ``@with_comms`` (test_process_group_multiprocess.py) also runs as ``python file.py``."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch_npu  # noqa: F401
from torch_npu.testing.common_distributed import TEST_SKIPS, skipIfUnsupportMultiNPU
from torch_npu.testing.testcase import TestCase

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)

SAMPLE = textwrap.dedent('''
    import os
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch_npu
    from torch_npu.testing.testcase import TestCase, run_tests
    from torch_npu.testing.common_utils import create_common_tensor, SupportedDevices
    from torch_npu.testing.common_distributed import skipIfUnsupportMultiNPU
    from torch_npu.testing.decorator import Dtypes, Formats, instantiate_tests


    class TestOps(TestCase):
        def test_add(self):
            cpu_x, npu_x = create_common_tensor([np.float32, 0, [2, 3, 4, 5]], -1, 1)
            self.assertEqual(torch_npu.get_npu_format(npu_x), 0)
            self.assertRtolEqual((cpu_x + 1).numpy(), (npu_x + 1).cpu().numpy())
            self.assertEqual(cpu_x + 1, (npu_x + 1).cpu(), prec=1e-6)

        @SupportedDevices(["Ascend910B"])
        def test_on_910b(self):
            self.assertEqual(torch.npu.get_device_name(0), "Ascend910B1")

        @SupportedDevices(["Ascend310P"])
        def test_on_310p(self):
            raise AssertionError("should have been skipped")

        @skipIfUnsupportMultiNPU(64)
        def test_needs_64_npus(self):
            raise AssertionError("should have been skipped")


    @instantiate_tests
    class TestDtypes(TestCase):
        @Dtypes(torch.float, torch.half)
        @Formats(2, 29)
        def test_mul(self, dtype, npu_format):
            cpu_x = torch.rand(4, 4).to(dtype)
            npu_x = torch_npu.npu_format_cast(cpu_x.npu(), npu_format)
            self.assertEqual(torch_npu.get_npu_format(npu_x), npu_format)
            self.assertRtolEqual((cpu_x.float() * 2).to(dtype), (npu_x * 2).cpu())


    class HcomAllReduceTest(TestCase):
        @classmethod
        def _init_dist_hccl(cls, rank, world_size):
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = os.environ["SAMPLE_PORT"]
            torch_npu.npu.set_device(rank)
            dist.init_process_group(backend="hccl", world_size=world_size, rank=rank)
            return dist

        @classmethod
        def _test_all_reduce(cls, rank, input1, world_size, init_pg, c2p, done_event):
            group = init_pg(rank, world_size)
            x = input1.npu()
            group.all_reduce(x)
            c2p.put((rank, x.cpu()))
            done_event.wait(timeout=400)          # the tensor travels as a shared fd: stay until it is received

        @skipIfUnsupportMultiNPU(2)
        def test_dist_all_reduce(self):
            world_size = 2
            cpu_x, _ = create_common_tensor([np.float32, 2, [2, 3, 16]], -10, 10)
            ctx = mp.get_context("spawn")
            c2p = ctx.Queue(world_size)
            done_event = ctx.Event()
            ps = [ctx.Process(target=self._test_all_reduce,
                              args=(i, cpu_x, world_size, self._init_dist_hccl, c2p, done_event))
                  for i in range(world_size)]
            for p in ps:
                p.start()
            for _ in range(world_size):
                rank, out = c2p.get(timeout=400)
                self.assertRtolEqual(cpu_x * world_size, out)
            done_event.set()
            for p in ps:
                p.join(timeout=400)
                self.assertEqual(p.exitcode, 0)


    if __name__ == "__main__":
        run_tests()
''')


def _env():
    from launcher.launch.config import free_port
    env = {k: v for k, v in os.environ.items()
           if k not in ("NPUSIM_BACKEND", "ASCEND_RT_VISIBLE_DEVICES", "RAY_ADDRESS", "MASTER_PORT", "MASTER_ADDR",
                        "WORLD_SIZE", "RANK", "LOCAL_RANK", "NPUSIM_CARD_DIR", "PYTEST_XDIST_WORKER")}
    env["SAMPLE_PORT"] = str(free_port())
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture
def sample(tmp_path):
    path = tmp_path / "test_torch_npu_style.py"
    path.write_text(SAMPLE)
    return path


def test_a_torch_npu_style_file_runs_as_a_script(sample):
    done = subprocess.run([sys.executable, str(sample), "-v"], capture_output=True, text=True, env=_env(),
                          cwd=sample.parent, timeout=800, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    assert "test_dist_all_reduce (__main__.HcomAllReduceTest" in out and "Ran 9 tests" in out, out[-3000:]
    assert "OK (skipped=2)" in out, out[-3000:]
    for name in ("test_mul_float32_2", "test_mul_float16_29"):
        assert name in out


def test_a_torch_npu_style_file_runs_under_pytest(sample):
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(sample)],
                          capture_output=True, text=True, env=_env(), cwd=sample.parent, timeout=800, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    assert "7 passed, 2 skipped" in out, out[-3000:]


def test_a_multiprocesstestcase_file_runs_as_a_script():
    """torch's MultiProcessTestCase with torch_npu's @with_comms, run as `python file.py <test>` (its full run
    under pytest is tests/torch_npu/test_process_group_multiprocess.py itself)."""
    script = Path(__file__).with_name("test_process_group_multiprocess.py")
    done = subprocess.run([sys.executable, str(script), "-v",
                           "HcclMultiProcessTest.test_cpu_tensor_is_refused_and_objects_still_travel"],
                          capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=800, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    assert "Ran 1 test" in out and "\nOK" in out, out[-3000:]


class _Probe(TestCase):
    __test__ = False

    def runTest(self):
        pass


def test_assertions_follow_torch_npu():
    case = _Probe()
    case.assertRtolEqual(torch.ones(100), torch.ones(100) + 5e-5)
    case.assertRtolEqual(torch.ones(4, dtype=torch.half), torch.ones(4, dtype=torch.half))
    with pytest.raises(AssertionError, match="result error"):
        case.assertRtolEqual(torch.ones(100), torch.ones(100) * 1.01)
    with pytest.raises(AssertionError, match="dtype error"):
        case.assertRtolEqual(torch.ones(2).numpy(), torch.ones(2).double().numpy())
    case.assertEqual(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-6]))
    case.assertEqual(torch.tensor([1.0]), torch.tensor([1.1]), prec=0.2)
    with pytest.raises(AssertionError):
        case.assertEqual(torch.tensor([1.0]), torch.tensor([1.1]))
    case.assertEqual({"a": torch.ones(2)}, {"a": torch.ones(2)})
    case.assertEqual([1, 2.0], (1, 2.0))
    case.assertNotEqual(torch.zeros(3), torch.ones(3))
    case.assertAlmostEqual(1.0, 1.0001, places=3)
    case.assertWarns(lambda: __import__("warnings").warn("x"))


def test_skip_decorator_counts_the_simulated_cards(monkeypatch):
    @skipIfUnsupportMultiNPU(8)
    def needs_8(self):
        return "ran"

    assert needs_8(None) == "ran"
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1")
    import unittest
    with pytest.raises(unittest.SkipTest, match="Multi-NPU 8 condition not satisfied"):
        needs_8(None)
    assert TEST_SKIPS["multi-npu-2"].message == "Need at least 2 ASCEND devices"
