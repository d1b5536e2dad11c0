"""npusim's pytest plugin (entry point ``pytest11``, name ``npusim``): distributed tests on warm simulated cards.

    def check_all_reduce(n):                  # module level: ranks re-import it
        comm = hccl.init()
        ...
        return value

    def test_all_reduce(npu_spawn):
        assert npu_spawn(check_all_reduce, nproc=4, args=(10,)) == [expected] * 4

Fixtures:

- ``npu_session`` (session scope): where the cards come from for the whole run — the persistent local cluster
  if ``launch --up`` started one, else a Ray session this process already has, else an embedded one started
  here (127.0.0.1, no dashboard) and stopped when the run ends. Cards stay booted between tests (reset after
  each job: a test sees nothing of the one before) and ranks are forked from a pre-imported server, so a small
  8-rank test costs a fraction of a second instead of seconds.
- ``npu_spawn`` (per test): ``npu_spawn(fn, nproc=4, args=(), **spawn_options)`` runs ``fn(*args)`` on every rank
  (``launcher.spawn``) and returns the per-rank results, or raises ``launcher.LaunchError`` naming every failed
  rank. Each call has a deadline: ``timeout=`` if given, else the ``npu_timeout`` marker's
  (``@pytest.mark.npu_timeout(30)``), else ``NPUSIM_SPAWN_TIMEOUT`` (default 120 s).

Importing this module costs nothing (npusim and Ray load only when a test asks for a fixture).
"""

from __future__ import annotations

import os

import pytest

DEFAULT_TIMEOUT = 120.0


def pytest_configure(config):
    config.addinivalue_line("markers", "npu_timeout(seconds): deadline of each npu_spawn call in this test")


class NpuSession:
    """What ``npu_session`` yields: ``kind`` is "cluster", "ray" (the caller's) or "embedded"."""

    def __init__(self, kind: str, address: str | None):
        self.kind, self.address = kind, address

    def __repr__(self) -> str:
        return f"NpuSession({self.kind}, {self.address})"


@pytest.fixture(scope="session")
def npu_session():
    import sys
    # ranks import the test module, hence pytest: the fork server imports it once instead (~0.1 s per rank)
    os.environ.setdefault("NPUSIM_FORK_PRELOAD", "pytest")
    from launcher import cluster
    info = cluster.find() if os.environ.get("NPUSIM_CLUSTER", "1") != "0" else None
    if info is not None:
        yield NpuSession("cluster", info.get("address"))
        return
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        yield NpuSession("ray", ray.get_runtime_context().gcs_address)
        return
    from rt.config import load_config
    from rt.ray import session
    import ray
    session.start_local_ray(load_config(None))
    session._started_here = False              # ours to stop, not rt.finalize's
    try:
        yield NpuSession("embedded", ray.get_runtime_context().gcs_address)
    finally:
        session._started_here = True
        session.stop_ray()                     # drains the warm cards first


@pytest.fixture
def npu_spawn(npu_session, request):
    import launcher
    marker = request.node.get_closest_marker("npu_timeout")
    default = float(marker.args[0]) if marker and marker.args else float(os.environ.get("NPUSIM_SPAWN_TIMEOUT",
                                                                                        DEFAULT_TIMEOUT))

    def npu_spawn(fn, nproc: int = 4, args=(), **options):
        options.setdefault("timeout", default)
        return launcher.spawn(fn, nproc=nproc, args=args, **options)
    return npu_spawn
