"""pyACL programs (tests/acl/programs/, written in the style of CANN's public samples) run unchanged on
simulated cards: ``python prog.py`` in a subprocess, exactly as a user runs one, results checked against
numpy inside each program. Most use in-process cards (NPUSIM_BACKEND=local, fast); one runs as a user's
would, on the embedded Ray session, and one as a multi-process job under ``launch``."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).resolve().parent / "programs"
sys.path.insert(0, str(ROOT / "examples"))
import acl_standin  # noqa: E402

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Stand-ins for ResNet-50's .om: static batch 1 and dynamic gears 1/2/4 (small images keep it quick)."""
    d = tmp_path_factory.mktemp("models")
    acl_standin.build(str(d / "resnet50.om"), None, hw=32)
    acl_standin.build(str(d / "resnet50_dyn.om"), [1, 2, 4], hw=16)
    return d


def run(program, *args, backend="local", extra_env=None, timeout=120, cwd=None):
    env = {k: v for k, v in os.environ.items() if k not in ("NPUSIM_BACKEND", "ASCEND_RT_VISIBLE_DEVICES",
                                                              "NPUSIM_ACL_STRICT", "RAY_ADDRESS")}
    if backend:
        env["NPUSIM_BACKEND"] = backend
    env.update(extra_env or {})
    done = subprocess.run([sys.executable, str(PROGRAMS / program), *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=cwd or ROOT)
    assert done.returncode == 0, f"{program} exited {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    return done


def test_memory_management_sample(tmp_path):
    done = run("memory.py", cwd=tmp_path)
    assert done.stdout.strip().endswith("OK")
    # each failure was logged once, with its code and message, and the program kept running
    assert "acl.rt.free_host failed with 207002" in done.stderr and "double free" in done.stderr


def test_synchronous_dynamic_batch_inference(models):
    done = run("infer_sync.py", models / "resnet50_dyn.om", models / "resnet50_dyn.npz", models / "resnet50.om")
    assert "batch 4: output dims [4, 1000]" in done.stdout and done.stdout.strip().endswith("OK")


def test_asynchronous_inference_with_the_report_thread_on_ray(models, tmp_path):
    """The default backend (the embedded Ray session), as `python prog.py` runs it for a user."""
    # one visible card: the program uses card 0, and every card it could see would boot as a Ray worker (~1 s CPU)
    done = run("infer_async.py", models / "resnet50.om", models / "resnet50.npz", backend=None, cwd=tmp_path,
               extra_env={"ASCEND_RT_VISIBLE_DEVICES": "0"})
    assert "6 images classified asynchronously" in done.stdout
    assert "Traceback" not in done.stderr, done.stderr


def test_two_cards_from_one_process(models):
    done = run("two_devices.py", models / "resnet50.om", models / "resnet50.npz")
    assert "OK: two cards from one process" in done.stdout


def test_no_call_lets_an_exception_escape():
    done = run("hostile.py", timeout=140)
    assert " 0 escaped" in done.stdout, done.stdout


def test_strict_mode_refuses_a_wrong_memcpy_kind(tmp_path):
    prog = tmp_path / "strict.py"
    prog.write_text(
        "import numpy as np, acl\n"
        "assert acl.init() == 0 and acl.rt.set_device(0) == 0\n"
        "dev, ret = acl.rt.malloc(64, 0)\n"
        "a = np.ones(16, np.float32)\n"
        "ret = acl.rt.memcpy(dev, 64, acl.util.numpy_to_ptr(a), 64, 2)   # says D2H, is H2D\n"
        "print('ret', ret)\n"
        "assert ret == 100000, ret\n"
        "assert 'NPUSIM_ACL_STRICT' in acl.get_recent_err_msg()\n"
        "assert acl.rt.launch_callback(print, 1, 1, 0) == 107015   # no thread subscribed to the stream\n")
    env = dict(os.environ, NPUSIM_BACKEND="local", NPUSIM_ACL_STRICT="1")
    done = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_real_atc_om_is_refused_with_directions(tmp_path):
    om = tmp_path / "resnet50.om"
    om.write_bytes(b"IMOD" + bytes(252) + b"\x00" * 1024)          # an ATC ModelFileHeader's magic
    prog = tmp_path / "load.py"
    prog.write_text(
        "import sys, acl\n"
        "assert acl.init() == 0 and acl.rt.set_device(0) == 0\n"
        "model_id, ret = acl.mdl.load_from_file(sys.argv[1])\n"
        "print(model_id, ret)\n"
        "print(acl.get_recent_err_msg())\n")
    env = dict(os.environ, NPUSIM_BACKEND="local")
    done = subprocess.run([sys.executable, str(prog), str(om)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    first, message = done.stdout.split("\n", 1)
    assert first == "0 100013"                                      # ACL_ERROR_PARSE_MODEL
    assert "ATC-compiled" in message and "GraphBuilder" in message and "docs/pyacl.md" in message


def test_a_pyacl_program_under_launch(tmp_path):
    """Multi-process pyACL: each rank sets its own device (DEVICE_ID), as CANN's multi-card samples do."""
    prog = tmp_path / "ranks.py"
    prog.write_text(
        "import os, numpy as np, acl\n"
        "dev = int(os.environ['DEVICE_ID'])\n"
        "assert acl.init() == 0 and acl.rt.set_device(dev) == 0\n"
        "ptr, ret = acl.rt.malloc(64, 0)\n"
        "a = np.full(16, dev + 1, np.float32)\n"
        "assert acl.rt.memcpy(ptr, 64, acl.util.numpy_to_ptr(a), 64, 1) == 0\n"
        "b = bytes(64)\n"
        "assert acl.rt.memcpy(acl.util.bytes_to_ptr(b), 64, ptr, 64, 2) == 0\n"
        "assert np.frombuffer(b, np.float32).tolist() == [dev + 1.0] * 16\n"
        "print('rank', os.environ['RANK'], 'device', acl.rt.get_device())\n"
        "assert acl.rt.free(ptr) == 0 and acl.rt.reset_device(dev) == 0 and acl.finalize() == 0\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NPUSIM_BACKEND", "ASCEND_RT_VISIBLE_DEVICES")}
    done = subprocess.run([sys.executable, "-m", "launcher", "--nproc", "2", str(prog)], capture_output=True,
                          text=True, env=env, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[rank0]:rank 0 device (0, 0)" in done.stdout and "[rank1]:rank 1 device (1, 0)" in done.stdout


def test_init_after_finalize_and_releases_left_to_del_on_ray(tmp_path):
    """On the embedded Ray session, as a user's program runs: acl.init() works again after acl.finalize() (Ray
    once kept the first session's spilling directory in its config, and the second start failed with 500000),
    and objects an acllite-style program releases in ``__del__`` at interpreter shutdown — after npusim's atexit
    finalize released them — report 0 and log nothing."""
    prog = tmp_path / "cycle.py"
    prog.write_text(
        "import numpy as np, acl\n"
        "for round_ in range(2):\n"
        "    assert acl.init() == 0, round_\n"
        "    assert acl.rt.set_device(0) == 0\n"
        "    ptr, ret = acl.rt.malloc(64, 0)\n"
        "    assert ret == 0\n"
        "    a = np.full(16, round_ + 1, np.float32)\n"
        "    assert acl.rt.memcpy(ptr, 64, acl.util.numpy_to_ptr(a), 64, 1) == 0\n"
        "    b = np.zeros(16, np.float32)\n"
        "    assert acl.rt.memcpy(acl.util.numpy_to_ptr(b), 64, ptr, 64, 2) == 0\n"
        "    assert b.tolist() == [round_ + 1.0] * 16\n"
        "    assert acl.rt.free(ptr) == 0 and acl.rt.reset_device(0) == 0 and acl.finalize() == 0\n"
        "class Resource:\n"
        "    def __init__(self):\n"
        "        assert acl.init() == 0 and acl.rt.set_device(0) == 0\n"
        "        self.context, ret = acl.rt.create_context(0)\n"
        "        self.stream, ret = acl.rt.create_stream()\n"
        "        self.ptr, ret = acl.rt.malloc(1024, 0)\n"
        "    def __del__(self):\n"
        "        rets = [acl.rt.free(self.ptr), acl.rt.destroy_stream(self.stream),\n"
        "                acl.rt.destroy_context(self.context), acl.rt.reset_device(0), acl.finalize()]\n"
        "        print('released at exit:', rets, flush=True)\n"
        "resource = Resource()\n"
        "print('OK')\n")
    done = run(str(prog), backend=None, cwd=tmp_path, extra_env={"ASCEND_RT_VISIBLE_DEVICES": "0"})
    assert "OK" in done.stdout and "released at exit: [0, 0, 0, 0, 0]" in done.stdout, done.stdout + done.stderr
    assert "failed with" not in done.stderr and "Traceback" not in done.stderr, done.stderr
