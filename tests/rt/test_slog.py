"""CANN's host log conventions (rt/diag/slog.py): levels, the plog file and its line format, stdout, the module
tags, and the CANN error-code tags in what is logged.

The environment is read once per process, so most tests run a small program in a subprocess with the
variables set (in-process cards: ``backend="local"``, no Ray).
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap

import pytest

PLOG_NAME = re.compile(r"^plog-(\d+)_(\d{14,17})\.log$")
LINE = re.compile(r"^\[(DEBUG|INFO|WARNING|ERROR)\] ([A-Z]+)\((\d+),([^)]*)\):"
                  r"(\d{4}-\d{2}-\d{2}-\d{2}:\d{2}:\d{2}\.\d{3}\.\d{3}) \[([^\]:]+):(\d+)\]\[(\d+)\](.*)$")
TIMEOUT = 90


@pytest.fixture
def run(tmp_path, run_python):
    """``run(body, **env)``: run ``body`` (dedented) as a program in ``tmp_path`` with a clean CANN log environment
    plus ``env`` — a fresh process (forked from the pre-imported server: conftest's ``run_python``)."""
    def run(body: str, **env) -> subprocess.CompletedProcess:
        full = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_", "HCCL_"))}
        full.pop("NPUSIM_BACKEND", None)
        full.setdefault("ASCEND_PROCESS_LOG_PATH", str(tmp_path / "log"))
        full.update({k: str(v) for k, v in env.items()})
        script = tmp_path / "prog.py"
        script.write_text(textwrap.dedent(body))
        proc = run_python([script], full, tmp_path, TIMEOUT)
        assert proc.returncode == 0, f"program failed:\n{proc.stdout}\n{proc.stderr}"
        return proc
    return run


def plogs(tmp_path) -> list:
    d = tmp_path / "log" / "debug" / "plog"
    return sorted(d.iterdir()) if d.exists() else []


def lines(tmp_path) -> list[re.Match]:
    out = []
    for f in plogs(tmp_path):
        for text in f.read_text().splitlines():
            m = LINE.match(text)
            assert m, f"not CANN's line format: {text!r}"
            out.append(m)
    return out


EVERY_LEVEL = """
    from rt import slog
    slog.debug(slog.RUNTIME, "a debug line %d", 0)
    slog.info(slog.RUNTIME, "an info line %d", 1)
    slog.warning(slog.RUNTIME, "a warning line %d", 2)
    slog.error(slog.RUNTIME, "an error line %d", 3)
"""


# ---------------------------------------------------------------- levels
@pytest.mark.parametrize("level, expected", [
    (None, ["ERROR"]), ("3", ["ERROR"]), ("2", ["WARNING", "ERROR"]), ("1", ["INFO", "WARNING", "ERROR"]),
    ("0", ["DEBUG", "INFO", "WARNING", "ERROR"]), ("junk", ["ERROR"]), ("7", ["ERROR"])])
def test_levels_filter_as_canns_do(run, tmp_path, level, expected):
    env = {} if level is None else {"ASCEND_GLOBAL_LOG_LEVEL": level}
    run(EVERY_LEVEL, **env)
    got = lines(tmp_path)
    assert [m[1] for m in got] == expected
    assert all(m[2] == "RUNTIME" and m[9].endswith(f"line {('DEBUG', 'INFO', 'WARNING', 'ERROR').index(m[1])}")
               for m in got)


def test_level_4_logs_nothing_and_creates_nothing(run, tmp_path):
    run(EVERY_LEVEL + """
    import rt
    rt.init("small", backend="local")
    rt.set_device(0)
    try:
        rt.malloc(1 << 40)
    except rt.AclError:
        pass
    """, ASCEND_GLOBAL_LOG_LEVEL="4")
    assert not (tmp_path / "log").exists()


def test_module_level_overrides_the_global_one(run, tmp_path):
    body = """
    from rt import slog
    slog.info(slog.HCCL, "hccl info")
    slog.info(slog.RUNTIME, "runtime info")
    slog.error(slog.RUNTIME, "runtime error")
    slog.error(slog.GE, "ge error")
    """
    run(body, ASCEND_GLOBAL_LOG_LEVEL="3", ASCEND_MODULE_LOG_LEVEL="HCCL=1:GE=4")
    assert [(m[2], m[9]) for m in lines(tmp_path)] == [("HCCL", "hccl info"), ("RUNTIME", "runtime error")]


def test_a_malformed_module_level_is_ignored_as_a_whole(run, tmp_path):
    run("""
    from rt import slog
    slog.info(slog.HCCL, "hccl info")
    slog.error(slog.HCCL, "hccl error")
    """, ASCEND_MODULE_LOG_LEVEL="HCCL=1:NOSUCHMODULE=0")
    assert [m[9] for m in lines(tmp_path)] == ["hccl error"]


def test_a_filtered_line_is_never_formatted(run, tmp_path):
    proc = run("""
    from rt import slog
    class Costly:
        n = 0
        def __str__(self):
            Costly.n += 1
            return "costly"
    for _ in range(1000):
        slog.debug(slog.RUNTIME, "%s", Costly())
    print(Costly.n, slog.enabled(slog.RUNTIME, slog.DEBUG), slog.enabled(slog.RUNTIME, slog.ERROR))
    """)
    assert proc.stdout.split() == ["0", "False", "True"]
    assert plogs(tmp_path) == []


# ---------------------------------------------------------------- files
def test_plog_file_name_and_line_format(run, tmp_path):
    proc = run("""
    import os, threading
    from rt import slog
    slog.error(slog.HCCL, "first\\nsecond line")
    print(os.getpid(), threading.get_native_id(), slog.current_file())
    """)
    pid, tid, current = proc.stdout.split()
    files = plogs(tmp_path)
    assert [str(f) for f in files] == [current]
    m = PLOG_NAME.match(files[0].name)
    assert m and m[1] == pid
    got = lines(tmp_path)
    assert [m[9] for m in got] == ["first", "second line"]          # each line of a message has the header
    for m in got:
        assert (m[1], m[2], m[3], m[8]) == ("ERROR", "HCCL", pid, tid)
        assert m[4] and (m[6], m[7]) == ("prog.py", "4")               # the program's own line


def test_a_process_that_logs_nothing_creates_no_file(run, tmp_path):
    run("""
    import rt
    rt.init("small", backend="local")
    rt.set_device(0)
    rt.free(rt.malloc(4 << 20))
    rt.reset_device(0)
    rt.finalize()
    """)
    assert not (tmp_path / "log").exists()


def test_default_log_root_is_home_ascend_log(run, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    run(EVERY_LEVEL, HOME=str(home), ASCEND_PROCESS_LOG_PATH="")
    files = list((home / "ascend" / "log" / "debug" / "plog").iterdir())
    assert len(files) == 1 and PLOG_NAME.match(files[0].name)


def test_print_to_stdout_instead_of_the_file(run, tmp_path):
    proc = run(EVERY_LEVEL, ASCEND_SLOG_PRINT_TO_STDOUT="1", ASCEND_GLOBAL_LOG_LEVEL="1")
    out = proc.stdout.splitlines()
    assert [LINE.match(x)[1] for x in out] == ["INFO", "WARNING", "ERROR"]
    assert not (tmp_path / "log").exists()


def test_an_unwritable_log_root_warns_once_and_never_raises(run, tmp_path):
    (tmp_path / "file").write_text("")
    proc = run(EVERY_LEVEL * 3 + """
    import rt
    rt.init("small", backend="local")
    rt.set_device(0)
    try:
        rt.malloc(1 << 40)
    except rt.AclError as e:
        print("raised", e.code)
    """, ASCEND_PROCESS_LOG_PATH=str(tmp_path / "file" / "below"))
    assert proc.stdout.split() == ["raised", "207001"]
    assert proc.stderr.count("cannot write the log file") == 1


def test_a_forked_child_writes_its_own_file(run, tmp_path):
    run("""
    import os
    from rt import slog
    slog.error(slog.RUNTIME, "parent before")
    pid = os.fork()
    if pid == 0:
        slog.error(slog.RUNTIME, "child")
        os._exit(0)
    os.waitpid(pid, 0)
    slog.error(slog.RUNTIME, "parent after")
    """)
    files = plogs(tmp_path)
    assert len(files) == 2
    by_pid = {PLOG_NAME.match(f.name)[1]: [LINE.match(x)[9] for x in f.read_text().splitlines()] for f in files}
    assert sorted(by_pid.values()) == [["child"], ["parent before", "parent after"]]


def test_files_rotate_and_only_the_newest_are_kept(run, tmp_path):
    run("""
    from rt import slog
    slog.FILE_BYTES = 2000
    for i in range(200):
        slog.error(slog.RUNTIME, "line %d %s", i, "x" * 40)
    """, ASCEND_HOST_LOG_FILE_NUM="3")
    files = plogs(tmp_path)
    assert len(files) == 3 and all(PLOG_NAME.match(f.name) for f in files)
    assert all(f.stat().st_size <= 2000 for f in files)
    assert lines(tmp_path)[-1][9].startswith("line 199 ")


def test_threads_log_whole_lines(run, tmp_path):
    run("""
    import threading
    from rt import slog
    def body(t):
        for i in range(200):
            slog.error(slog.HCCL, "thread %d line %d", t, i)
    ts = [threading.Thread(target=body, args=(t,)) for t in range(8)]
    for t in ts: t.start()
    for t in ts: t.join()
    """)
    got = lines(tmp_path)                    # every line parses: none torn or interleaved
    assert len(got) == 1600 and len({m[8] for m in got}) == 8


# ---------------------------------------------------------------- what npusim logs
def test_out_of_memory_is_logged_with_el0004_and_the_requested_bytes(run, tmp_path):
    proc = run("""
    import rt
    rt.init("small", backend="local")
    rt.set_device(0)
    try:
        rt.malloc(48 << 20)
        rt.malloc(48 << 20)
    except rt.AclError as e:
        print(e.code, e.message)
    """)
    code, message = proc.stdout.strip().split(" ", 1)
    assert code == "207001"
    assert message.startswith("EL0004: Failed to allocate memory. malloc: out of memory on card 0")
    assert f"requested {48 << 20} bytes" in message
    errors = [m for m in lines(tmp_path) if m[1] == "ERROR"]
    assert len(errors) == 1
    assert (errors[0][2], errors[0][6], errors[0][7], errors[0][9]) == ("RUNTIME", "prog.py", "7", message)


def test_a_host_side_oom_carries_el0004_too(run, tmp_path):
    run("""
    import rt
    rt.init("small", backend="local")
    rt.set_device(0)
    for call in (lambda: rt.malloc(1 << 70), lambda: rt.empty((1 << 40, 1 << 40), "float32")):
        try:
            call()
        except rt.AclError as e:
            assert e.code == 207001 and e.message.startswith("EL0004: Failed to allocate memory. "), e.message
            print(e.message)
        else:
            raise SystemExit("no error")
    """)


def test_a_failed_hccl_call_is_logged_with_the_hccl_tag(run, tmp_path):
    run("""
    import rt, hccl
    rt.init("small", backend="local")
    rt.set_device(0)
    try:
        hccl.comm_init_root_info(2, hccl.get_root_info(), 0)      # rank 1 never comes
    except hccl.HcclError as e:
        assert e.code == hccl.HCCL_E_TIMEOUT
    """, HCCL_CONNECT_TIMEOUT="1")
    errors = [m for m in lines(tmp_path) if m[1] == "ERROR"]
    assert len(errors) == 1
    assert errors[0][2] == "HCCL" and "EI0006 ranks [1] never joined" in errors[0][9]
    assert errors[0].group(6, 7) == ("prog.py", "6")


COLLECTIVE_MISMATCH = """
    import threading, rt, hccl
    rt.init("small", backend="local")
    comms = hccl.comm_init_all([0, 1])
    def body(i):
        rt.set_device(i)
        p = rt.malloc(1024)
        try:
            if i == 0:
                hccl.all_reduce(p, p, 16, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comms[i])
            else:
                hccl.broadcast(p, 16, hccl.HCCL_DATA_TYPE_FP32, 0, comms[i])
            rt.synchronize_stream(None)
        except hccl.HcclError:
            pass
    ts = [threading.Thread(target=body, args=(i,)) for i in range(2)]
    for t in ts: t.start()
    for t in ts: t.join()
"""


def test_a_failed_collective_is_logged_at_its_synchronize(run, tmp_path):
    run(COLLECTIVE_MISMATCH)
    errors = [m for m in lines(tmp_path) if m[1] == "ERROR"]
    assert len(errors) == 2 and all("ranks called different collectives" in m[9] for m in errors)
    assert {m.group(6, 7) for m in errors} == {("prog.py", "13")}


def test_a_failed_collective_is_tagged_hccl(run, tmp_path):
    run(COLLECTIVE_MISMATCH)
    assert [m[2] for m in lines(tmp_path) if m[1] == "ERROR"] == ["HCCL", "HCCL"]


def test_info_lines_of_devices_contexts_and_communicators(run, tmp_path):
    run("""
    import rt, hccl
    rt.init("small", backend="local")
    comms = hccl.comm_init_all([0, 1])
    for c in comms:
        hccl.comm_destroy(c)
    ctx = rt.create_context(1)
    rt.destroy_context(ctx)
    rt.reset_device(0)
    rt.reset_device(1)
    """, ASCEND_GLOBAL_LOG_LEVEL="1")
    got = [(m[2], m[9]) for m in lines(tmp_path) if m[1] == "INFO"]
    text = "\n".join(f"{a} {b}" for a, b in got)
    for want in ("RUNTIME context created on device 0 (card 0, node 0) (the device's default)",
                 "RUNTIME set_device(1): card 1 of node 0, 1 reference(s)",
                 "HCCL comm_init_root_info: communicator '", "rank 1 of 2 on card 1 (node 0)",
                 "HCCL comm_destroy: communicator '", "RUNTIME context created on device 1 (card 1, node 0)\n",
                 "RUNTIME context destroyed on device 1 (card 1, node 0)", "RUNTIME reset_device(0): releasing"):
        assert want in text + "\n", want
    assert {a for a, _ in got} == {"RUNTIME", "HCCL"}


def test_large_mallocs_and_frees_at_debug(run, tmp_path):
    run("""
    import rt
    rt.init("small", backend="local")
    rt.set_device(0)
    rt.free(rt.malloc(1 << 20))
    rt.free(rt.malloc(4096))
    """, ASCEND_GLOBAL_LOG_LEVEL="0")
    debug = [m[9] for m in lines(tmp_path) if m[1] == "DEBUG"]
    assert len(debug) == 2
    assert debug[0].startswith("malloc: 1048576 bytes at 0x") and debug[1].startswith("free: 1048576 bytes at 0x")


def test_a_failed_acl_call_is_logged_by_ascendcl_with_its_ret(run, tmp_path):
    run("""
    import acl
    acl.init()
    acl.rt.set_device(0)
    ptr, ret = acl.rt.malloc(1 << 40, 0)
    assert ret == 207001, ret
    acl.rt.reset_device(0)
    acl.finalize()
    """, NPUSIM_BACKEND="local", NPUSIM_CONFIG="small")
    errors = [(m[2], m[6], m[7], m[9]) for m in lines(tmp_path) if m[1] == "ERROR"]
    assert [e[0] for e in errors] == ["RUNTIME", "ASCENDCL"]
    assert "EL0004" in errors[0][3]
    assert errors[1][1:] == ("prog.py", "5", "acl.rt.malloc failed, ret = 207001")
