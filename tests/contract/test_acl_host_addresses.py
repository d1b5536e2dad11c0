"""Issue #21 items 3 and 5 through the pyACL facade: no host address a program passes may crash the process,
and a hostile acl.json is the documented config-file code, not 500000 "internal error"."""

import mmap
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import acl
import rt
from rt.host.procmaps import unmapped

pytestmark = pytest.mark.timeout(120)
PARAM_INVALID = 107000
PARSE_FILE, INVALID_FILE = 100006, 100003


def _ptr(array):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)          # the discontiguous-array warning
        return acl.util.numpy_to_ptr(array)


def test_the_reversed_view_copy_of_the_issue_is_refused_in_a_fresh_process():
    """The probe's exact program: before the fix it died with SIGABRT (rc -6); run apart so a regression
    fails this test, not the whole session."""
    code = textwrap.dedent("""
        import os, warnings
        os.environ["NPUSIM_BACKEND"] = "local"
        warnings.simplefilter("ignore")
        import numpy as np, acl
        assert acl.init() == 0 and acl.rt.set_device(0) == 0
        n = 4 << 20
        dev, ret = acl.rt.malloc(n, 0)
        host = np.zeros(n, np.uint8)
        print(acl.rt.memcpy(acl.util.numpy_to_ptr(host[::-1]), n, dev, n, 2))
        print(acl.rt.memcpy(dev, n, acl.util.numpy_to_ptr(host[::-1]), n, 1))
        acl.rt.free(dev); acl.rt.reset_device(0); acl.finalize()
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(PARAM_INVALID)] * 2


def test_strided_and_reversed_views_copy_within_their_memory(acl0):
    n = 4096
    dev, _ = acl.rt.malloc(n, 0)
    pattern = np.arange(n, dtype=np.uint8)
    assert acl.rt.memcpy(dev, n, _ptr(pattern), n, 1) == 0
    base = np.zeros(n, np.uint8)
    rev = base[::-1]
    # the pointer of a reversed view is its first element: the highest address of its memory
    assert acl.rt.memcpy(_ptr(rev), n, dev, n, 2) == PARAM_INVALID
    assert "past the end" in acl.get_recent_err_msg()
    assert acl.rt.memcpy(_ptr(rev), 1, dev, 1, 2) == 0 and base[-1] == pattern[0]
    # a strided view spans its parent's memory: a copy inside that span is the program's business, no crash
    half = np.zeros(n, np.uint8)[::2]                   # its own memory: n - 1 bytes from its pointer
    assert acl.rt.memcpy(_ptr(half), n - 1, dev, n - 1, 2) == 0
    assert acl.rt.memcpy(_ptr(half), n, dev, n, 2) == PARAM_INVALID
    acl.rt.free(dev)


def test_read_only_mapped_memory_is_refused_not_written(acl0, tmp_path):
    """A strided view of a read-only memmap: writing through its raw address would be SIGSEGV."""
    path = tmp_path / "ro.bin"
    path.write_bytes(bytes(1 << 16))
    ro = np.memmap(path, mode="r", dtype=np.uint8)[::2]
    dev, _ = acl.rt.malloc(4096, 0)
    assert acl.rt.memset(dev, 4096, 7, 4096) == 0
    addr = _ptr(ro)
    assert acl.rt.memcpy(addr, 1000, dev, 1000, 2) == PARAM_INVALID
    assert "not writable" in acl.get_recent_err_msg()
    assert acl.rt.memset(addr, 1000, 1, 1000) == PARAM_INVALID
    assert acl.rt.memcpy(dev, 1000, addr, 1000, 1) == 0                 # reading it is fine
    assert acl.util.ptr_to_bytes(addr, 16) == bytes(16)
    assert not np.asarray(np.memmap(path, mode="r", dtype=np.uint8)).any()
    acl.rt.free(dev)


def test_unmapped_reads_the_process_memory_map():
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ)
    addr = np.frombuffer(page, np.uint8).ctypes.data
    assert unmapped(addr, mmap.PAGESIZE, write=False) is None
    assert "not writable" in unmapped(addr, 1, write=True)
    assert "not mapped" in unmapped(8, 16, write=False)                  # page 0 is never mapped
    rw = np.zeros(1 << 20, np.uint8)
    assert unmapped(rw.ctypes.data, rw.nbytes, write=True) is None
    page.close()


@pytest.mark.parametrize("content, code", [
    ("[" * 100_000 + "]" * 100_000, PARSE_FILE),                          # RecursionError in json
    ('{"dump": ' + "7" * 5000 + "}", PARSE_FILE),                          # past int()'s digit limit
    ("{not json", PARSE_FILE),
    (b"\xff\xfe", PARSE_FILE),
])
def test_init_with_a_hostile_acl_json_returns_the_config_file_code(tmp_path, monkeypatch, content, code):
    monkeypatch.setenv("NPUSIM_BACKEND", "local")
    path = tmp_path / "acl.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    try:
        assert acl.init(str(path)) == code
        assert not rt.is_initialized()
        msg = acl.get_recent_err_msg()
        assert "not valid JSON" in msg and len(msg) < 600
        assert acl.init(str(tmp_path / "missing.json")) == INVALID_FILE
    finally:
        if rt.is_initialized():
            rt.finalize()


def test_a_view_registered_at_the_same_start_does_not_retire_the_array(acl0):
    """a and a[::-1] span the same memory: the view's registration must not replace a's, or a's address
    would die with the (temporary) view."""
    a = np.arange(64, dtype=np.uint8)
    ptr = acl.util.numpy_to_ptr(a)
    _ptr(a[::-1])                                       # registered and dropped at once
    import gc
    gc.collect()
    assert acl.util.ptr_to_bytes(ptr, 64) == a.tobytes()


def test_load_from_mem_reads_read_only_memory_and_refuses_a_size_past_the_bytes(acl0, tmp_path):
    from rt.mdl import GraphBuilder
    g = GraphBuilder("ro")
    x = g.input("x", "float32", [2, 4])
    g.output("y", g.op("Relu", [x]))
    data = g.serialize()
    path = tmp_path / "m.om"
    path.write_bytes(data * 2)
    strided = np.memmap(path, mode="r", dtype=np.uint8)[::2]    # spans 2 * len - 1 bytes: the raw-memory path
    assert not strided.flags.c_contiguous
    model_id, ret = acl.mdl.load_from_mem(_ptr(strided), len(data))
    assert ret == 0 and acl.mdl.unload(model_id) == 0   # reading a read-only mapping is fine
    assert acl.mdl.load_from_mem(data, len(data) + 1)[1] == 100000
