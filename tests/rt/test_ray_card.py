"""The Ray path: card actors reached over their Unix sockets, shared by processes, reclaiming the dead.

All tests share one embedded Ray session (``ray_session`` in conftest.py); each test's ``rt.init()``
joins it under a job id of its own, so its card actors are fresh.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import importlib.util
import threading
import time
from pathlib import Path

import numpy as np
import pytest

# signal method: a hung test fails and the fixtures still shut Ray down (the thread method would
# os._exit the whole run and orphan Ray's agent processes).
pytestmark = [pytest.mark.ray, pytest.mark.timeout(90, method="signal")]

MiB = 1 << 20
H2D, D2H = 1, 2


def sibling(name: str):
    """The test module ``name`` beside this one, under the name pytest gives it (``--import-mode=importlib``
    puts no test directory on sys.path, so a plain ``import test_streams`` would not find it)."""
    full = f"tests.rt.{name}"
    if full not in sys.modules:
        spec = importlib.util.spec_from_file_location(full, Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return sys.modules[full]

# A second OS process on the same card: joins the session (RAY_ADDRESS) and the job (NPUSIM_JOB),
# allocates, reports what it sees, then waits for a command on stdin.
CHILD = r"""
import json, sys
import rt
rt.init()
rt.set_device(0)
seen_free = rt.get_mem_info()[0]
ptr = rt.malloc(int(sys.argv[1]))
rt.memset(ptr, 64, 1, 64)
print(json.dumps({"seen_free": seen_free, "pid": __import__("os").getpid()}), flush=True)
if sys.stdin.readline().strip() == "finalize":
    rt.finalize()
    print(json.dumps({"finalized": True}), flush=True)
"""


class Child:
    """A child process running CHILD, with line-based JSON output read under a deadline."""

    def __init__(self, ray_address: str, nbytes: int):
        env = dict(os.environ, RAY_ADDRESS=ray_address, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, str(nbytes)], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def read(self, timeout: float = 60.0) -> dict:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            line = None
        if line is None:
            self.kill()
            pytest.fail(f"child process gave no output; stderr:\n{self.proc.stderr.read()[-3000:]}")
        return json.loads(line)

    def send(self, text: str) -> None:
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


def poll_free(rt, want: int, timeout: float = 30.0) -> int:
    """Poll get_mem_info until at least ``want`` bytes are free (or the deadline passes)."""
    deadline = time.monotonic() + timeout
    free = rt.get_mem_info()[0]
    while free < want and time.monotonic() < deadline:
        time.sleep(0.1)
        free = rt.get_mem_info()[0]
    return free


def test_round_trip_4mib_through_the_card_actor(ray_rt):
    rt = ray_rt
    rt.set_device(0)
    assert rt.get_device_count() == 2                 # ray_rt: ASCEND_RT_VISIBLE_DEVICES=0,1 of the node's 8
    data = np.random.default_rng(0).integers(0, 256, 4 * MiB, dtype=np.uint8)
    ptr = rt.malloc(data.nbytes)
    rt.memcpy(ptr, data.nbytes, data, data.nbytes, H2D)
    back = np.empty_like(data)
    rt.memcpy(back, back.nbytes, ptr, data.nbytes, D2H)
    assert np.array_equal(back, data)
    pinned = rt.malloc_host(4 * MiB)                  # the pinned path maps the buffer on the card
    s = rt.create_stream()
    rt.memcpy_async(pinned, 4 * MiB, ptr, 4 * MiB, D2H, s)
    rt.synchronize_stream(s)
    assert np.array_equal(np.frombuffer(pinned, np.uint8), data)
    rt.free_host(pinned)
    rt.free(ptr)
    with pytest.raises(rt.AclError) as info:           # card errors come back as AclError with the code
        rt.free(ptr)
    assert info.value.code == rt.ACL_ERROR_RT_MEMORY_FREE


def test_two_processes_share_card0(ray_rt, ray_session):
    rt = ray_rt
    rt.set_device(0)
    total = rt.get_mem_info()[1]
    mine = rt.malloc(64 * MiB)
    free_before_child = rt.get_mem_info()[0]
    assert free_before_child <= total - 64 * MiB
    child = Child(ray_session, 32 * MiB)
    try:
        report = child.read()
        assert report["seen_free"] == free_before_child     # the child sees this process's 64 MiB
        assert rt.get_mem_info()[0] <= free_before_child - 32 * MiB   # and we see its 32 MiB
        child.send("finalize")
        assert child.read() == {"finalized": True}
        assert child.proc.wait(30) == 0
    finally:
        child.kill()
    assert poll_free(rt, free_before_child) == free_before_child
    # The child's finalize must leave the shared card reachable: a new context still connects.
    ctx = rt.create_context(0)
    rt.free(rt.malloc(MiB))
    rt.destroy_context(ctx)
    rt.set_device(0)
    rt.free(mine)


def test_killed_process_allocations_are_reclaimed(ray_rt, ray_session):
    rt = ray_rt
    rt.set_device(0)
    free_before = rt.get_mem_info()[0]
    child = Child(ray_session, 48 * MiB)
    try:
        child.read()
        assert rt.get_mem_info()[0] <= free_before - 48 * MiB
        child.proc.send_signal(signal.SIGKILL)
        assert child.proc.wait(30) == -signal.SIGKILL
    finally:
        child.kill()
    assert poll_free(rt, free_before) == free_before


@pytest.mark.parametrize("threads", [3])
def test_order_under_load_through_the_socket_channel(ray_rt, threads):
    run_chain = sibling("test_streams").run_chain    # the numpy-replayed random op chain
    rt = ray_rt
    rt.set_device(0)
    run_chain(rt.create_stream(), seed=100, steps=400)
    failures = []

    def worker(seed):
        try:
            rt.set_device(0)
            run_chain(rt.create_stream(), seed=seed, steps=200)
        except BaseException as e:
            failures.append((seed, e))

    ts = [threading.Thread(target=worker, args=(s,)) for s in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts) and not failures, failures
