"""Limits of the environment (issue #21 items 8 and 9): a memory cgroup's limit bounds what cards and pinned
buffers may back (207001 instead of the OOM killer's SIGKILL), and HCCL timeouts must be finite and in
CANN's range (HCCL_E_PARA naming the variable, never a timeout that never fires or an OverflowError)."""

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import hccl
import rt
from hccl.comm import options_from_env
from rt import memlimit
from rt.memlimit import CgroupLimit
from rt.ray.actor import JobBoard

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


# ---------------------------------------------------------------- the cgroup limit reader, on fake files
def _fake(tmp_path, files: dict) -> str:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


def test_v2_limits_of_the_own_cgroup_and_its_ancestors(tmp_path):
    pod = "sys/fs/cgroup/kubepods/pod1"
    root = _fake(tmp_path, {
        "proc/self/cgroup": "0::/kubepods/pod1/ctr\n",
        "proc/self/mountinfo": "22 1 0:21 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
                               "23 1 8:1 / / rw - ext4 /dev/sda1 rw\n",
        "sys/fs/cgroup/kubepods/memory.max": "2147483648\n",
        "sys/fs/cgroup/kubepods/memory.current": "400000000\n",
        f"{pod}/memory.max": "1073741824\n",
        f"{pod}/memory.current": "300000000\n",
        f"{pod}/memory.stat": "anon 150000000\ninactive_file 100000000\nactive_file 50000000\n",
        f"{pod}/ctr/memory.max": "max\n",                    # no limit of its own
        f"{pod}/ctr/memory.current": "250000000\n",
    })
    limits = memlimit.cgroup_limits(root)
    assert [(Path(c.path).name, c.limit, c.usage) for c in limits] == [
        ("pod1", GIB, 200000000),                           # reclaimable page cache is not in use
        ("kubepods", 2 * GIB, 400000000)]
    mem = memlimit.budget(root)
    assert mem.total == min(GIB, mem.total) and mem.cgroup == limits[0]
    assert mem.available == GIB - 200000000
    assert f"allows {GIB} bytes and 200000000 are in use" in mem.describe()


def test_v1_limit_seen_from_inside_a_container(tmp_path):
    """Without a cgroup namespace /proc/self/cgroup names the host's path, while the mount shows only the
    container's own cgroup: the mount's root is that path."""
    root = _fake(tmp_path, {
        "proc/self/cgroup": "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n",
        "proc/self/mountinfo": "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
                               "36 31 0:33 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "536870912\n",
        "sys/fs/cgroup/memory/memory.usage_in_bytes": "100000000\n",
        "sys/fs/cgroup/memory/memory.stat": "cache 1\ntotal_inactive_file 40000000\n",
    })
    assert [(c.limit, c.usage) for c in memlimit.cgroup_limits(root)] == [(512 << 20, 60000000)]


@pytest.mark.parametrize("limit", ["9223372036854771712", "max", "garbage", "", "٣٣٣", "9" * 5000])
def test_no_limit_or_unreadable_limit_files_mean_the_host_bounds(tmp_path, limit):
    root = _fake(tmp_path, {
        "proc/self/cgroup": "4:memory:/job\n",
        "proc/self/mountinfo": "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
        "sys/fs/cgroup/memory/job/memory.limit_in_bytes": limit,
        "sys/fs/cgroup/memory/job/memory.usage_in_bytes": "1",
    })
    assert memlimit.cgroup_limits(root) == []
    assert memlimit.budget(root).cgroup is None


def test_no_proc_files_at_all(tmp_path):
    assert memlimit.cgroup_limits(str(tmp_path)) == []


# ---------------------------------------------------------------- the limit bounds cards and pinned memory
@pytest.fixture
def one_gib_cgroup(monkeypatch):
    limit = CgroupLimit("/sys/fs/cgroup/fake", GIB, 100 << 20)
    monkeypatch.setattr(memlimit, "cgroup_limits", lambda root="/": [limit])
    return limit


def test_malloc_past_the_cgroup_limit_fails_with_207001_and_the_numbers(one_gib_cgroup, dev0):
    with pytest.raises(rt.AclError) as e:
        dev0.malloc(GIB)                                    # the 2 GiB card would take it; the cgroup cannot
    assert e.value.code == 207001
    assert "bytes requested" in e.value.message and "available" in e.value.message
    assert f"memory cgroup /sys/fs/cgroup/fake allows {GIB} bytes and {100 << 20} are in use" in e.value.message
    dev0.free(dev0.malloc(1 << 20))                         # small allocations go on


def test_malloc_host_defaults_to_half_the_cgroup_limit(one_gib_cgroup, rt_local):
    with pytest.raises(rt.AclError) as e:
        rt_local.malloc_host(600 << 20)
    assert e.value.code == 207001 and f"{GIB // 2}-byte limit" in e.value.message
    rt_local.free_host(rt_local.malloc_host(1 << 20))


def test_an_object_store_larger_than_the_cgroup_is_refused_before_ray(one_gib_cgroup, tmp_path):
    path = tmp_path / "store.toml"
    path.write_text(f"[ray]\nobject_store_bytes = {2 * GIB}\n")
    cfg = rt.config.load_config(str(path))
    with pytest.raises(rt.AclError) as e:
        rt.config.check_object_store(cfg)
    fits = (GIB - (100 << 20)) - 100_000_000                # available in the cgroup, less Ray's reserve
    assert f"at most {fits}" in e.value.message and "cgroup /sys/fs/cgroup/fake" in e.value.message


def test_a_model_whose_intermediates_exceed_the_cgroup_fails_with_207001(monkeypatch):
    import numpy as np

    from rt.card.executor import Executor
    from rt.mdl import format as fmt
    from rt.mdl.builder import GraphBuilder
    monkeypatch.setattr(memlimit, "cgroup_limits", lambda root="/": [CgroupLimit("/fake", GIB, 900 << 20)])
    g = GraphBuilder("chain")
    v = g.input("x", "float32", [1, 1 << 22])               # 16 MiB; five 16 MiB intermediates
    for _ in range(5):
        v = g.op("Relu", [v])
    g.output("y", v)
    ex = Executor(fmt.parse(g.serialize()), max_bytes=2 * GIB)   # each fits the card, all do not fit the cgroup
    with pytest.raises(rt.AclError) as e:
        ex.run([np.zeros((1, 1 << 22), np.float32)])
    assert e.value.code == 207001 and "intermediates" in e.value.message and "/fake" in e.value.message


# ---------------------------------------------------------------- a real 1 GiB memory cgroup
PROGRAM = """
import rt
rt.init(backend="local")
rt.set_device(0)
held = []
try:
    for _ in range(40):                     # 2.5 GiB in all: past the 1 GiB cgroup long before the 2 GiB card
        held.append(rt.malloc(64 << 20))
    print("NO ERROR", flush=True)
except rt.AclError as e:
    print("CODE", e.code, e.message, flush=True)
try:
    rt.malloc_host(900 << 20)
    print("HOST NO ERROR", flush=True)
except rt.AclError as e:
    print("HOST CODE", e.code, flush=True)
"""


def _own_cgroup_parent() -> tuple[str, str] | None:
    """(directory to create a child cgroup in, the limit file's name) or None if this machine cannot."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            parent = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
            if os.path.isfile(os.path.join(parent, "memory.limit_in_bytes")):
                return parent, "memory.limit_in_bytes"
    top = "/sys/fs/cgroup"
    try:
        if "memory" in Path(top, "cgroup.subtree_control").read_text().split():
            return top, "memory.max"   # v2: a child of the root (a cgroup with processes has no memory children)
    except OSError:
        pass
    return None


@pytest.fixture
def memory_cgroup():
    found = _own_cgroup_parent()
    if found is None or os.geteuid() != 0:
        pytest.skip("no writable memory cgroup here (needs root and cgroup v1 memory or v2 with memory enabled)")
    parent, limit_file = found
    path = os.path.join(parent, f"npusim-test-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(path)
        Path(path, limit_file).write_text(str(GIB))
    except OSError as e:
        if os.path.isdir(path):
            os.rmdir(path)
        pytest.skip(f"cannot make a memory cgroup under {parent}: {e}")
    try:
        yield path
    finally:
        deadline = time.monotonic() + 10
        while os.path.isdir(path):
            try:
                os.rmdir(path)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def test_in_a_1_gib_cgroup_malloc_gets_207001_not_sigkill(memory_cgroup):
    env = dict(os.environ, PYTHONPATH=str(ROOT), NPUSIM_BACKEND="local")
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    procs = os.path.join(memory_cgroup, "cgroup.procs")
    done = subprocess.run(["sh", "-c", f'echo $$ > "{procs}" && exec "$0" -c "$1"', sys.executable, PROGRAM],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"killed or failed (rc {done.returncode}): {done.stdout}{done.stderr[-2000:]}"
    assert "CODE 207001" in done.stdout and "memory cgroup" in done.stdout, done.stdout
    assert f"allows {GIB} bytes" in done.stdout
    assert "HOST CODE 207001" in done.stdout, done.stdout


# ---------------------------------------------------------------- HCCL timeouts
@pytest.fixture
def clean_hccl_env(monkeypatch):
    for name in ("HCCL_EXEC_TIMEOUT", "HCCL_CONNECT_TIMEOUT", "HCCL_ALGO", "HCCL_DETERMINISTIC"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


BAD_SECONDS = ["nan", "NaN", "inf", "-inf", "Infinity", "-1", "1e3", "1_0", "١٢٠", "12x", "9" * 5000, "0x10"]


@pytest.mark.parametrize("value", BAD_SECONDS + ["2147483648"])
def test_hccl_exec_timeout_must_be_plain_seconds_in_range(clean_hccl_env, value):
    clean_hccl_env.setenv("HCCL_EXEC_TIMEOUT", value)
    with pytest.raises(hccl.HcclError) as e:
        options_from_env()
    assert e.value.code == 1 and "HCCL_EXEC_TIMEOUT=" in e.value.message
    assert "[0, 2147483647]" in e.value.message and len(e.value.message) < 300


@pytest.mark.parametrize("value", BAD_SECONDS + ["0", "0.5", "7201"])
def test_hccl_connect_timeout_must_be_plain_seconds_in_range(clean_hccl_env, value):
    clean_hccl_env.setenv("HCCL_CONNECT_TIMEOUT", value)
    with pytest.raises(hccl.HcclError) as e:
        options_from_env()
    assert e.value.code == 1 and "HCCL_CONNECT_TIMEOUT=" in e.value.message and "[1, 7200]" in e.value.message


def test_valid_timeouts_are_taken(clean_hccl_env):
    clean_hccl_env.setenv("HCCL_EXEC_TIMEOUT", "0")               # CANN: 0 = never
    clean_hccl_env.setenv("HCCL_CONNECT_TIMEOUT", " 7200 ")
    opts = options_from_env()
    assert opts["exec_timeout"] == 1e9 and opts["connect_timeout"] == 7200
    clean_hccl_env.setenv("HCCL_EXEC_TIMEOUT", "2147483647")
    clean_hccl_env.setenv("HCCL_CONNECT_TIMEOUT", "2.5")
    assert options_from_env()["exec_timeout"] == 2147483647 and options_from_env()["connect_timeout"] == 2.5


def test_a_nan_connect_timeout_is_named_not_a_silent_card(clean_hccl_env, dev0):
    clean_hccl_env.setenv("HCCL_CONNECT_TIMEOUT", "nan")
    with pytest.raises(hccl.HcclError) as e:
        hccl.comm_init_root_info(1, hccl.get_root_info(), 0)
    assert e.value.code == 1 and "HCCL_CONNECT_TIMEOUT='nan'" in e.value.message


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), -1, 10 ** 400, 2147483648, "5", None, True])
def test_comm_config_exec_timeout_must_be_finite_and_in_range(clean_hccl_env, dev0, timeout):
    with pytest.raises(hccl.HcclError) as e:
        hccl.comm_init_root_info_config(1, hccl.get_root_info(), 0, {"exec_timeout": timeout})
    assert e.value.code == 1 and "exec_timeout" in e.value.message


def test_job_board_survives_an_infinite_or_nan_timeout():
    """The board is reached only with checked timeouts; still, inf must not raise OverflowError in the actor."""
    board = JobBoard.__ray_metadata__.modified_class()
    got = {}
    waiter = threading.Thread(target=lambda: got.update(r=board.join("k", 2, 0, "a", float("inf"))), daemon=True)
    waiter.start()
    time.sleep(0.2)
    assert board.join("k", 2, 1, "b", 5.0) == {"values": ["a", "b"]}
    waiter.join(10)
    assert not waiter.is_alive(), "JobBoard.join('k', rank 0, timeout=inf) did not return within 10 s of rank 1"
    assert got.get("r") == {"values": ["a", "b"]}
    assert board.join("n", 2, 0, "a", float("nan")) == {"joined": [0]}    # nan: no wait, a plain timeout
