"""launcher.spawn in the internal no-cards mode (no Ray): results, argument passing, errors, no leaks."""

import dataclasses
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import psutil
import pytest

import launcher
from launcher.spawn import function_reference
from rt.errors import AclError

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)


@dataclasses.dataclass
class Point:
    x: int
    y: float


def rank_info(scale):
    env = os.environ
    return {"rank": int(env["RANK"]) * scale, "world": int(env["WORLD_SIZE"]), "local": int(env["LOCAL_RANK"]),
            "node": int(env["NODE_RANK"]), "device": int(env["DEVICE_ID"]), "pid": os.getpid()}


def make_point(p: Point):
    rank = int(os.environ["RANK"])
    return Point(p.x + rank, p.y * rank)


def fail_on_odd_ranks(message):
    if int(os.environ["RANK"]) % 2:
        raise KeyError(f"{message} on rank {os.environ['RANK']}")
    return "fine"


def exit_hard():
    if os.environ["RANK"] == "2":
        print("about to die", flush=True)
        os._exit(5)
    return os.environ["RANK"]


def unpicklable_result():
    return threading.Lock()


class Holder:
    @staticmethod
    def nested_static(v):
        return v + int(os.environ["RANK"])


def test_results_come_back_in_rank_order():
    results = launcher.spawn(rank_info, nproc=4, args=(10,), _no_cards=True)
    assert [r["rank"] for r in results] == [0, 10, 20, 30]
    assert all(r["world"] == 4 for r in results)
    assert [(r["local"], r["device"]) for r in results] == [(i, i) for i in range(4)]
    assert len({r["pid"] for r in results}) == 4 and os.getpid() not in {r["pid"] for r in results}


def test_two_nodes_and_custom_classes_round_trip():
    results = launcher.spawn(make_point, nproc=2, nnodes=2, args=(Point(3, 1.5),), _no_cards=True)
    assert results == [Point(3 + r, 1.5 * r) for r in range(4)]
    assert launcher.spawn(Holder.nested_static, nproc=3, args=(7,), _no_cards=True) == [7, 8, 9]


def test_failure_names_each_failed_rank_with_type_message_and_traceback():
    with pytest.raises(launcher.LaunchError) as info:
        launcher.spawn(fail_on_odd_ranks, nproc=4, args=("no such key",), _no_cards=True)
    err = info.value
    text = str(err)
    failed = sorted(f["rank"] for f in err.failures)
    # The first odd rank to fail is certain; the other may be stopped before it raises.
    assert failed and set(failed) <= {1, 3}
    for f in err.failures:
        assert f["type"] == "KeyError" and f"no such key on rank {f['rank']}" in f["message"]
        assert "in fail_on_odd_ranks" in f["traceback"]
        assert f"rank {f['rank']} (node 0)" in text
    assert "KeyError" in text and "Traceback (most recent call last)" in text
    assert "ranks failed" in text


def test_rank_dying_without_exception_reports_exit_code_and_output():
    with pytest.raises(launcher.LaunchError) as info:
        launcher.spawn(exit_hard, nproc=3, _no_cards=True)
    (failure,) = info.value.failures
    assert failure["rank"] == 2 and failure["returncode"] == 5 and failure["type"] is None
    assert "rank 2 (node 0) (first failure): exited with 5" in str(info.value)


def test_unpicklable_result_is_a_clear_rank_failure():
    with pytest.raises(launcher.LaunchError) as info:
        launcher.spawn(unpicklable_result, nproc=1, _no_cards=True)
    assert "lock" in info.value.failures[0]["message"].lower()


def test_nested_functions_and_lambdas_are_refused_before_anything_starts():
    def local_fn():
        return 1

    for fn in (local_fn, lambda: 1):
        with pytest.raises(AclError) as info:
            function_reference(fn)
        assert "module level" in str(info.value)


@pytest.mark.slow
def test_repeated_spawns_leak_no_threads_fds_or_temp_dirs(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # other jobs on this machine use /tmp too
    tmp = tmp_path
    launcher.spawn(rank_info, nproc=2, args=(1,), _no_cards=True)  # warm up imports
    me = psutil.Process()
    threads, fds = threading.active_count(), me.num_fds()
    before = {p.name for p in tmp.glob("npusim-*")}
    # A Ray session another test left running in this process (a session fixture) keeps starting its
    # own workers; those are not spawn's.
    ray_roots = [c for c in me.children(recursive=True) if _is_ray(c)]
    existing = {c.pid for c in me.children(recursive=True)}     # e.g. this process's reaper (rt/reaper.py)
    for _ in range(5):
        assert len(launcher.spawn(rank_info, nproc=2, args=(1,), _no_cards=True)) == 2
    assert threading.active_count() == threads
    assert me.num_fds() == fds
    assert {p.name for p in tmp.glob("npusim-*")} - before == set()
    theirs = {c.pid for root in ray_roots for c in [root, *_descendants(root)]}
    left = [c for c in me.children(recursive=True)
            if c.pid not in theirs and c.pid not in existing and not _is_ray(c) and _alive(c)]
    assert left == []


def _is_ray(proc) -> bool:
    """A process of a Ray session (gcs, raylet, workers, Ray's Python agents)."""
    try:
        name, cmd = proc.name(), " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return name in ("raylet", "gcs_server") or name.startswith("ray::") or "/ray/" in cmd or "ray." in cmd


def _descendants(proc):
    try:
        return proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(proc) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_spawn_from_a_scripts_main(tmp_path):
    path = tmp_path / "driver.py"
    path.write_text(textwrap.dedent("""
        import os
        import launcher

        class Box:
            def __init__(self, v):
                self.v = v

        def work(box):
            return Box(box.v * 100 + int(os.environ["RANK"]))

        print("module body runs in every rank and in the driver")

        if __name__ == "__main__":
            out = launcher.spawn(work, nproc=3, args=(Box(4),), _no_cards=True)
            print("RESULT", [b.v for b in out], all(type(b) is Box for b in out))
    """))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "RESULT [400, 401, 402] True" in done.stdout
    # The body ran in the driver unprefixed and once per rank prefixed; the __main__ block only once.
    assert done.stdout.count("module body runs") == 4


def test_spawn_inside_a_rank_is_refused(monkeypatch):
    monkeypatch.setenv("NPUSIM_SPAWN_DIR", "/nonexistent")
    with pytest.raises(Exception, match="inside a spawned rank"):
        launcher.spawn(rank_info, nproc=1, args=(1,), _no_cards=True)
