"""Issue #21 items 3 and 5 through the pyACL facade: no host address a program passes may crash the process,
and a hostile acl.json is the documented config-file code, not 500000 "internal error"."""

import ctypes
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
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, check=False)
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


# ---------------------------------------------------------------- issue #24 item 2: host addresses from anywhere
def _upload(n, seed=0):
    data = np.random.default_rng(seed).integers(0, 255, n, dtype=np.uint8)
    dev, ret = acl.rt.malloc(n, 0)
    assert ret == 0 and acl.rt.memcpy(dev, n, acl.util.numpy_to_ptr(data), n, 1) == 0
    return dev, data


def test_ctypes_and_ndarray_ctypes_data_addresses_copy_both_ways(acl0):
    """Addresses the program never registered: ``ndarray.ctypes.data`` and a ctypes buffer, as sources and
    destinations of memcpy, memcpy_async and memset."""
    import ctypes
    n = 1 << 16
    dev, data = _upload(n)
    out = np.zeros(n, np.uint8)
    assert acl.rt.memcpy(out.ctypes.data, n, dev, n, 2) == 0
    np.testing.assert_array_equal(out, data)
    buf = (ctypes.c_ubyte * n)()
    stream, _ = acl.rt.create_stream()
    assert acl.rt.memcpy_async(ctypes.addressof(buf), n, dev, n, 2, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert bytes(buf) == data.tobytes()
    assert acl.rt.memset(ctypes.addressof(buf), n, 9, 100) == 0 and bytes(buf[:101]) == b"\x09" * 100 + bytes(buf[100:101])
    assert acl.rt.memcpy(dev, n, ctypes.addressof(buf), n, 1) == 0
    back = np.zeros(n, np.uint8)
    assert acl.rt.memcpy(back.ctypes.data, n, dev, n, 2) == 0
    assert back[:100].tolist() == [9] * 100 and (back[100:] == data[100:]).all()
    assert acl.rt.destroy_stream(stream) == 0 and acl.rt.free(dev) == 0


@pytest.mark.parametrize("view", ["reversed", "strided", "reversed_2d", "transposed"])
def test_views_with_any_strides_through_ctypes_data(acl0, view):
    """``view.ctypes.data`` of a view is its first element's address; a copy at it covers the memory from
    there, as on CANN (the elements' order is the program's business), and reads and writes the parent."""
    parent = np.zeros(4096, np.uint8)
    v = {"reversed": parent[::-1], "strided": parent[::3], "reversed_2d": parent.reshape(64, 64)[::-1, ::-2],
         "transposed": parent.reshape(64, 64).T}[view]
    start = v.ctypes.data - parent.ctypes.data
    room = parent.nbytes - start                   # the memory from the view's first element to the parent's end
    dev, data = _upload(room, seed=3)
    assert acl.rt.memcpy(v.ctypes.data, room, dev, room, 2) == 0
    np.testing.assert_array_equal(parent[start:], data)
    assert acl.rt.memcpy(dev, room, v.ctypes.data, room, 1) == 0
    assert acl.rt.free(dev) == 0


def test_torch_tensor_data_ptr_is_a_host_address(acl0):
    torch = pytest.importorskip("torch")
    n = 1 << 12
    src = torch.arange(n, dtype=torch.float32)
    dev, _ = acl.rt.malloc(n * 4, 0)
    assert acl.rt.memcpy(dev, n * 4, src.data_ptr(), n * 4, 1) == 0
    dst = torch.zeros(n, dtype=torch.float32)
    assert acl.rt.memcpy(dst.data_ptr(), n * 4, dev, n * 4, 2) == 0
    assert torch.equal(dst, src)
    flipped = torch.zeros(n, dtype=torch.float32).flip(0)          # a copy in torch: its own memory
    half = torch.zeros(2 * n, dtype=torch.float32)[::2]             # a strided view: memory of its base
    assert acl.rt.memcpy(half.data_ptr(), n * 4, dev, n * 4, 2) == 0
    assert acl.rt.memcpy(flipped.data_ptr(), n * 4, dev, n * 4, 2) == 0 and torch.equal(flipped, src)
    assert acl.rt.free(dev) == 0


def test_unmapped_and_read_only_addresses_are_refused_naming_the_range(acl0):
    # 8 pages of which the upper 4 are made inaccessible: a range running past the first 4 is refused, never
    # written. (Running past the end of a mapping instead would write into whatever mapping the kernel placed
    # after it — another thread's stack, say — when one is there: that corrupted the test process.)
    page = mmap.mmap(-1, mmap.PAGESIZE * 8)
    addr = np.frombuffer(page, np.uint8).ctypes.data               # mapped rw, never registered
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mprotect(ctypes.c_void_p(addr + mmap.PAGESIZE * 4), ctypes.c_size_t(mmap.PAGESIZE * 4), 0) == 0
    dev, _ = acl.rt.malloc(mmap.PAGESIZE * 8, 0)
    assert acl.rt.memcpy(addr, mmap.PAGESIZE * 4, dev, mmap.PAGESIZE * 4, 2) == 0
    assert acl.rt.memcpy(addr, mmap.PAGESIZE * 8, dev, mmap.PAGESIZE * 8, 2) == PARAM_INVALID
    msg = acl.get_recent_err_msg()
    assert f"0x{addr:x}" in msg and f"0x{addr + mmap.PAGESIZE * 8:x}" in msg, msg
    assert acl.rt.memcpy(dev, mmap.PAGESIZE * 8, addr, mmap.PAGESIZE * 8, 1) == PARAM_INVALID     # nor read
    ro = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ)
    ro_addr = np.frombuffer(ro, np.uint8).ctypes.data
    assert acl.rt.memcpy(ro_addr, 16, dev, 16, 2) == PARAM_INVALID
    assert "not writable" in acl.get_recent_err_msg()
    assert acl.rt.memset(ro_addr, 16, 0, 16) == PARAM_INVALID
    assert acl.rt.memcpy(dev, 16, ro_addr, 16, 1) == 0                # reading it is fine
    for bad in (8, 0x1234, (1 << 47) + 4096, (1 << 64) - 16):
        assert acl.rt.memcpy(bad, 16, dev, 16, 2) == PARAM_INVALID
        msg = acl.get_recent_err_msg()
        assert f"0x{bad:x}" in msg and "16 bytes" in msg, msg
        assert acl.rt.memcpy(dev, 16, bad, 16, 1) == PARAM_INVALID
    acl.rt.free(dev)
    ro.close()


def test_memory_unmapped_after_the_map_was_cached_is_refused_not_read(acl0):
    """The map is cached: memory unmapped since must still be a refusal (mincore sees it), never a SIGSEGV."""
    n = mmap.PAGESIZE * 16
    m = mmap.mmap(-1, n)
    addr = np.frombuffer(m, np.uint8).ctypes.data
    dev, _ = acl.rt.malloc(n, 0)
    assert acl.rt.memcpy(dev, n, addr, n, 1) == 0                      # the map is cached with it mapped
    import gc
    gc.collect()
    m.close()                                                          # munmap
    assert unmapped(addr, n, write=False) is not None
    assert acl.rt.memcpy(dev, n, addr, n, 1) == PARAM_INVALID
    assert acl.rt.memcpy(addr, n, dev, n, 2) == PARAM_INVALID
    acl.rt.free(dev)


def test_a_mapping_made_after_the_map_was_cached_is_found():
    """A miss re-reads /proc/self/maps: memory the program maps later is accepted, not refused from a stale map."""
    first = mmap.mmap(-1, mmap.PAGESIZE)
    assert unmapped(np.frombuffer(first, np.uint8).ctypes.data, 1, write=True) is None    # the map is now cached
    later = mmap.mmap(-1, mmap.PAGESIZE * 3)
    addr = np.frombuffer(later, np.uint8).ctypes.data
    assert unmapped(addr, mmap.PAGESIZE * 3, write=True) is None
    assert "not a range of 64-bit addresses" in unmapped((1 << 64) - 8, 16, write=False)
    assert unmapped(-4096, 16, write=False) is not None


def test_ptr_helpers_read_any_mapped_address_and_refuse_the_rest(acl0):
    import ctypes
    raw = ctypes.create_string_buffer(b"pyACL reads this", 16)
    assert acl.util.ptr_to_bytes(ctypes.addressof(raw), 16) == b"pyACL reads this"
    view = acl.util.ptr_to_numpy(ctypes.addressof(raw), (4,), 6)         # NPY_UINT32
    assert view.tobytes() == b"pyACL reads this"
    assert acl.util.ptr_to_bytes(16, 16) == b""
    assert "16 is not mapped in this process" in acl.get_recent_err_msg().replace("0x10", "16")


def test_a_freed_pinned_address_taken_by_another_mapping_is_that_mappings(acl0):
    """free_host unmaps the buffer; once the address space holds another mapping, an address in it is the new
    mapping's (accepted), while the freed buffer itself stays a use after free."""
    host, _ = acl.rt.malloc_host(1 << 20)
    assert acl.rt.free_host(host) == 0
    assert acl.rt.memset(host, 16, 0, 16) == PARAM_INVALID and "use after free" in acl.get_recent_err_msg()
    taken = None
    for _ in range(64):                                  # the kernel usually hands the range out again at once
        m = mmap.mmap(-1, 1 << 20)
        if np.frombuffer(m, np.uint8).ctypes.data == host:
            taken = m
            break
    if taken is None:
        pytest.skip("the kernel did not reuse the freed range")
    assert acl.rt.memset(host, 16, 7, 16) == 0
    assert bytes(taken[:16]) == b"\x07" * 16


def test_a_cached_writable_range_remapped_read_only_is_refused_not_written():
    """The failure that took a whole test session down once: an address cached as rw, unmapped, then mapped
    read-only by something else. The cache is confirmed by the kernel, so the write is refused, not a SIGSEGV."""
    n = mmap.PAGESIZE * 4
    for _ in range(64):
        rw = mmap.mmap(-1, n)
        addr = np.frombuffer(rw, np.uint8).ctypes.data
        assert unmapped(addr, n, write=True) is None                    # cached as writable
        import gc
        gc.collect()
        rw.close()
        ro = mmap.mmap(-1, n, prot=mmap.PROT_READ)
        if np.frombuffer(ro, np.uint8).ctypes.data == addr:
            break
        ro.close()
    else:
        pytest.skip("the kernel did not reuse the address")
    assert "not writable" in unmapped(addr, n, write=True)
    assert unmapped(addr, n, write=False) is None
    ro.close()
