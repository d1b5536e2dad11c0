"""Shared fixtures: an in-process runtime per test, one embedded Ray session for all Ray tests,
a deadline for every test, and a check at the end that nothing this session started is left behind.

- ``rt_local``: ``rt.init(backend="local")`` (cards as objects in this process, no Ray), finalized
  after the test whatever happens. ``rt_factory`` does the same with arguments (a config, a visible
  devices string) for tests that need them.
- ``ray_session``: session-scoped; starts ONE embedded Ray through ``rt.ray.session.start_local_ray`` on
  first use and shuts it down at the end of the test session. Tests then call ``rt.init()``, which
  joins it (and must not stop it: the fixture owns the session).
- Every test has a deadline: pytest-timeout (``timeout = 120`` in pyproject.toml); without the plugin
  a faulthandler watchdog ends a hung run instead of letting it hang silently.
- At session finish: every process the Ray session started is gone (killed by pid and reported if
  not), and no npusim/Ray file was left in /dev/shm.
- Two tiers. ``python -m pytest -q`` (the README's command) runs everything but the tests marked ``slow``:
  whole jobs that take 10 s or more each (many simulated nodes, killed processes, warm-card daemons, the contract
  sweep). ``--slow`` runs them too; ``--slow -m slow`` only them (``.ci/run``'s next step). The tests of a file
  named on the command line (or a node id) run whatever their tier.
"""

from __future__ import annotations

import faulthandler
import os
import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

DEADLINE_S = 120
_leftovers: list[str] = []          # problems found by fixture teardowns, reported at session finish
_shm_before: set[str] = set()
_ray_pids: set[int] = set()         # processes started by this test session's Ray
_log_root: str | None = None        # the session's scratch ASCEND_PROCESS_LOG_PATH, if it made one
_worker_tmp: str | None = None      # this pytest-xdist worker's own TMPDIR, if it is one


def _shm_names() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


# ---------------------------------------------------------------- deadlines
def pytest_configure(config):
    # a developer's persistent local cluster (launch --up) must not change what the tests exercise
    os.environ["NPUSIM_CLUSTER"] = "0"
    # Each pytest-xdist worker gets a TMPDIR of its own: npusim's per-user directory (card sockets, the
    # cluster daemon), the embedded Ray's session files, and every test's "nothing left behind" check are then
    # the worker's own, as if it ran alone on the machine.
    global _worker_tmp
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and _worker_tmp is None:
        _worker_tmp = os.environ["TMPDIR"] = tempfile.mkdtemp(prefix=f"npt-{worker}-")
        tempfile.tempdir = None                   # gettempdir() answers from TMPDIR again
    # the errors tests provoke on purpose are logged (rt/diag/slog.py; ERROR is CANN's default level): into a
    # scratch directory of this session, not the developer's ~/ascend/log
    global _shm_before, _log_root
    if "ASCEND_PROCESS_LOG_PATH" not in os.environ:
        _log_root = os.environ["ASCEND_PROCESS_LOG_PATH"] = tempfile.mkdtemp(prefix="npusim-test-log-")
    _shm_before = _shm_names()
    config.addinivalue_line("markers", "ray: needs the embedded Ray session (slow)")
    config.addinivalue_line("markers", "slow: the slow end-to-end tier, not run by default (--slow runs it)")


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true",
                     help="also run the slow end-to-end tier (tests marked slow; .ci/run runs it after the README's "
                          "command)")


def _named(config, item) -> bool:
    """Whether the command line named this test's file (or the test itself, by node id), not only a directory."""
    files = getattr(config, "_npusim_named_files", None)
    if files is None:
        base = Path(config.invocation_params.dir)
        files = config._npusim_named_files = {(base / a.split("::")[0]).resolve() for a in config.args
                                              if a.split("::")[0].endswith(".py")}
    return bool(files) and Path(item.path).resolve() in files


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    slow = [i for i in items if i.get_closest_marker("slow") is not None and not _named(config, i)]
    if slow:
        config.hook.pytest_deselected(items=slow)
        left_out = set(slow)
        items[:] = [i for i in items if i not in left_out]
        config._npusim_slow_left = len(slow)
        if hasattr(config, "workeroutput"):           # a pytest-xdist worker: tell the controller
            config.workeroutput["npusim_slow_left"] = len(slow)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: how many slow tests its workers left out (each collects the whole suite)."""
    left = getattr(node, "workeroutput", {}).get("npusim_slow_left", 0)
    node.config._npusim_slow_left = max(getattr(node.config, "_npusim_slow_left", 0), left)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    left = getattr(config, "_npusim_slow_left", 0)
    if left:
        terminalreporter.write_line(f"{left} slow end-to-end tests were not run (the slow tier): "
                                    f"python -m pytest -q --slow -m slow runs them")


def pytest_unconfigure(config):
    if _log_root is not None:
        shutil.rmtree(_log_root, ignore_errors=True)
    if _worker_tmp is not None:
        shutil.rmtree(_worker_tmp, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    # pytest-timeout is the deadline; if it is not installed, a watchdog still stops a hang.
    fallback = not item.config.pluginmanager.hasplugin("timeout")
    if fallback:
        faulthandler.dump_traceback_later(DEADLINE_S, exit=True)
    try:
        yield
    finally:
        if fallback:
            faulthandler.cancel_dump_traceback_later()


# ---------------------------------------------------------------- in-process runtime
@pytest.fixture
def rt_factory(monkeypatch):
    """``start(config=None, visible=None)`` → the ``rt`` module, initialized with the local backend."""
    import rt
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("NPUSIM_BACKEND", raising=False)
    rt.get_recent_err_msg()                         # start each test with a clean error text

    def start(config=None, visible=None):
        if visible is not None:
            monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", visible)
        rt.init(config, backend="local")
        return rt

    yield start
    if rt.is_initialized():
        rt.finalize()


@pytest.fixture
def rt_local(rt_factory):
    """The runtime with in-process cards (default config: 8 cards x 2 GiB)."""
    return rt_factory()


@pytest.fixture
def dev0(rt_local):
    """rt_local with device 0 set for the calling thread."""
    rt_local.set_device(0)
    return rt_local


@pytest.fixture
def acl0(monkeypatch):
    """The pyACL facade initialized with in-process cards (lenient, as CANN), device 0 set; finalized after."""
    import acl
    import rt
    monkeypatch.setenv("NPUSIM_BACKEND", "local")
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("NPUSIM_ACL_STRICT", raising=False)
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    acl.get_recent_err_msg()
    yield acl
    if rt.is_initialized():
        rt.finalize()


@pytest.fixture(scope="session")
def sweep_model() -> bytes:
    """A tiny offline model with a dynamic batch (gears 1, 2): Relu over float32 [-1, 4] — the model the contract
    sweeps load, describe and run while every other argument is hostile."""
    from rt.mdl import GraphBuilder
    g = GraphBuilder("sweep")
    g.output("y", g.op("Relu", [g.input("x", "float32", [-1, 4])]))
    g.set_dynamic_batch([1, 2])
    return g.serialize()


@pytest.fixture
def small_config(tmp_path):
    """Path of a config with 8 MiB of HBM per card (OOM is cheap to reach)."""
    path = tmp_path / "small.toml"
    path.write_text("[card]\nhbm_bytes = 8388608\n")
    return str(path)


# ---------------------------------------------------------------- programs in a fresh process
@pytest.fixture
def run_python():
    """``run_python(args, env, cwd, timeout)`` → ``subprocess.CompletedProcess`` (text) of ``python args``, as
    ``subprocess.run`` would give it — but forked from npusim's pre-imported fork server (launcher/forkserver/:
    the child becomes exactly ``python -u args`` with that environment), so a test that needs a fresh process
    per case pays ~0.05 s instead of an interpreter start and numpy/rt imports (~0.5 s). Falls back to a fresh
    interpreter when the environment differs in a start-up variable (the server's rule)."""
    import subprocess
    import sys
    import threading
    from launcher.forkserver import client as forkserver

    def run(args, env: dict, cwd, timeout: float) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-u", *map(str, args)]
        server = forkserver.server_for(argv, env)
        if server is None:
            return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        pipes = [os.pipe(), os.pipe()]
        ended, codes = threading.Event(), []
        pid = server.spawn(argv, env, str(cwd), pipes[0][1], pipes[1][1],
                           lambda code: (codes.append(code), ended.set()))
        for _, w in pipes:
            os.close(w)
        texts = [b"", b""]

        def drain(i):
            with os.fdopen(pipes[i][0], "rb") as f:
                texts[i] = f.read()
        readers = [threading.Thread(target=drain, args=(i,), daemon=True) for i in (0, 1)]
        for t in readers:
            t.start()
        if not ended.wait(timeout):
            os.kill(pid, 9)                              # ours: forked for this call
            raise subprocess.TimeoutExpired(argv, timeout)
        for t in readers:
            t.join(timeout)
        assert not any(t.is_alive() for t in readers), f"pid {pid} ({argv[2:]}) exited, but its output pipes are " \
                                                       f"still open after {timeout} s (a child of it holds them?)"
        out, err = (t.decode(errors="replace") for t in texts)
        return subprocess.CompletedProcess(argv, codes[0], out, err)
    return run


# ---------------------------------------------------------------- Ray
def _descendants() -> set[int]:
    try:
        return {p.pid for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return set()


@pytest.fixture(scope="session")
def npu_session():
    """One embedded Ray session (127.0.0.1, no dashboard) for every Ray test — this suite's override of the
    npusim pytest plugin's fixture (so ``npu_spawn`` uses it too), with the leak check below."""
    from launcher.pytest_plugin import NpuSession
    gen = _ray_session()
    address = next(gen)
    try:
        yield NpuSession("embedded", address)
    finally:
        next(gen, None)


@pytest.fixture(scope="session")
def ray_session(npu_session):
    """The session's GCS address (tests that join it as a Ray cluster)."""
    return npu_session.address


def _ray_session():
    import ray

    from rt.ray import session
    from rt.config import load_config
    if ray.is_initialized():
        pytest.fail("Ray is already initialized in the test process; the Ray fixture must own the session")
    before = _descendants()
    session.start_local_ray(load_config(None))
    # The fixture owns the session: rt.finalize() in a test must not shut it down.
    session._started_here = False
    address = ray.get_runtime_context().gcs_address
    try:
        yield address
    finally:
        from rt.host import reaper
        from launcher.forkserver import client as forkserver
        mine = {reaper._reaper.child} if reaper._reaper is not None else set()   # ours, not Ray's: outlives it
        if forkserver._server is not None:
            mine.add(forkserver._server.proc.pid)       # the rank fork server: lives as long as this process
        _ray_pids.update(_descendants() - before - mine)
        session._started_here = True
        session.stop_ray()              # shuts Ray down and has the reaper end its lingering agents now
        _wait_gone(_ray_pids, timeout=15)


@pytest.fixture
def ray_rt(ray_session, monkeypatch):
    """``rt`` initialized through Ray (joining the session) under a job id of its own, seeing cards 0 and 1;
    finalized after."""
    import rt
    # Two cards: rt.init() boots every visible card of the node at its first use, and each card actor is a Ray
    # worker costing ~1 s of CPU to start; the Ray tests use cards 0 and 1.
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1")
    monkeypatch.delenv("NPUSIM_BACKEND", raising=False)
    monkeypatch.delenv("NPUSIM_CARD_DIR", raising=False)
    job = "t" + uuid.uuid4().hex[:10]
    monkeypatch.setenv("NPUSIM_JOB", job)
    rt.init()
    try:
        yield rt
    finally:
        if rt.is_initialized():
            rt.finalize()
        from rt.ray import session
        sockets = os.path.join(session.socket_root(), f"ray-{job}")
        if os.path.exists(sockets):
            _leftovers.append(f"card socket directory {sockets} outlived rt.finalize()")


class CollectivesCheck:
    """``tests/scripts/collectives_check.py`` (every collective against numpy inside the ranks) and the check of
    what its 2 nodes x 4 ranks printed: shared by the two-Ray-node test and the simulated-nodes test."""

    script = str(Path(__file__).resolve().parent / "scripts" / "collectives_check.py")
    names = [f"{name} {tag}" for tag in ("small", "large")          # one hub exchange / hierarchical schedules
             for name in ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "scatter",
                          "all_to_all", "barrier")] + ["dtype-op sweep", "mismatch"]

    def assert_ran(self, proc, nnodes: int = 2, nproc: int = 4) -> None:
        out = proc.stdout
        assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
        placed = {int(m[1]): (int(m[2]), int(m[3]), int(m[4]))
                  for m in re.finditer(r"rank (\d+) node (\d+) card (\d+) algo_nodes (\d+)", out)}
        assert sorted(placed) == list(range(nnodes * nproc))
        for rank, (node, card, nodes) in placed.items():
            assert (node, card) == (rank // nproc, rank % nproc), (rank, node, card)
            assert nodes == nnodes                 # the communicator spans every node: hierarchical schedules
        for rank in range(nnodes * nproc):
            for name in self.names:
                assert f"rank {rank} OK {name}" in out, (rank, name, out[-2000:])


@pytest.fixture
def collectives_check():
    return CollectivesCheck()


def _wait_gone(pids: set[int], timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if psutil.pid_exists(p) and _not_zombie(p)}
        if alive:
            time.sleep(0.2)
    return alive


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# ---------------------------------------------------------------- leak check at the end
def pytest_sessionfinish(session, exitstatus):
    problems = list(_leftovers)
    alive = _wait_gone(_ray_pids, timeout=5) if _ray_pids else set()
    for pid in sorted(alive):
        try:
            proc = psutil.Process(pid)
            problems.append(f"process {pid} ({' '.join(proc.cmdline())[:120]}) outlived the Ray session")
            proc.kill()                       # ours: started by this session's Ray
        except psutil.Error:
            pass
    new_shm = {n for n in _shm_names() - _shm_before if "npusim" in n or "ray" in n or "plasma" in n}
    problems += [f"/dev/shm/{n} was left behind" for n in sorted(new_shm)]
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = "resources leaked by the test session:\n  " + "\n  ".join(problems)
        if reporter is not None:
            reporter.write_line("\n" + text, red=True)
        session.exitstatus = 1
