"""The pyACL facade in-process (in-process cards): conventions, the host-address registry, callbacks, and
what ``import acl`` does (nothing) before ``acl.init``."""

import gc
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest

import acl
import rt
from acl._hostptr import HostRegions

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------- import, detection
def test_import_is_side_effect_free_and_answers_ray_detection_from_the_config(tmp_path):
    cfg = tmp_path / "four.toml"
    cfg.write_text('[soc]\nname = "Ascend310P3"\n[node]\ncards = 4\n')
    code = ("import sys, acl, rt\n"
            "print(acl.rt.get_device_count(), acl.get_soc_name())\n"
            "assert not rt.is_initialized() and 'ray' not in sys.modules\n")
    env = dict(os.environ, NPUSIM_CONFIG=str(cfg), ASCEND_RT_VISIBLE_DEVICES="1,3")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(2,", "0)", "Ascend310P3"]


def test_ray_init_detects_the_simulated_npus_without_a_traceback():
    """Ray's NPU detection imports acl while Ray starts: it now finds the simulated cards (NPU: 8 and the
    SoC as accelerator type), where before it logged "Failed to detect NPU type" with a traceback."""
    temp = tempfile.mkdtemp(prefix="npusim-rd-", dir="/tmp")      # a short path: Ray's socket names are long
    code = ("import ray\n"
            "ray.init(include_dashboard=False, _node_ip_address='127.0.0.1', _temp_dir=%r)\n"
            "r = ray.cluster_resources()\n"
            "print(r.get('NPU'), sorted(k for k in r if k.startswith('accelerator_type')))\n"
            "ray.shutdown()\n") % temp
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "ASCEND_RT_VISIBLE_DEVICES")}
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=100)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    assert "Failed to detect NPU" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.split("\n")[0] == "8.0 ['accelerator_type:Ascend910B1']", done.stdout


def test_module_layout_and_probes_work_before_init():
    assert "bytes_to_ptr" in dir(acl.util) and acl.mdl.get_input_size_by_index is not None
    assert "rt.acl" not in sys.modules          # the facade lives above rt (acl/): nothing in rt imports it
    assert acl.get_data_buffer_size is acl.get_data_buffer_size_v2
    assert acl.get_version() == (1, 17, 0, 0)
    assert acl.float16_to_float(acl.float_to_float16(1.5)) == 1.5


# ---------------------------------------------------------------- conventions
def test_tuples_codes_and_int_handles(acl0):
    ctx, ret = acl.rt.create_context(0)
    stream, ret2 = acl.rt.create_stream()
    event, ret3 = acl.rt.create_event()
    assert (ret, ret2, ret3) == (0, 0, 0)
    assert all(isinstance(h, int) and h for h in (ctx, stream, event))
    assert acl.rt.get_context() == (ctx, 0)
    free, total, ret = acl.rt.get_mem_info(0)
    assert ret == 0 and 0 < free <= total
    assert acl.rt.get_device() == (0, 0) and acl.rt.get_run_mode() == (1, 0)
    assert acl.rt.stream_query(stream) == (0, 0)                       # ACL_STREAM_STATUS_COMPLETE
    # a handle of the wrong kind, or a destroyed one, is 100000 with a message that says which
    assert acl.rt.synchronize_stream(event) == 100000
    message = acl.get_recent_err_msg()
    assert "is not a stream" in message and "handle of an event" in message
    assert acl.rt.destroy_stream(stream) == 0 and acl.rt.destroy_stream(stream) == 100000
    assert "destroyed" in acl.get_recent_err_msg()
    assert acl.rt.destroy_event(event) == 0 and acl.rt.destroy_context(ctx) == 0


def test_a_failure_is_logged_once_and_kept_for_get_recent_err_msg(acl0, caplog):
    with caplog.at_level(logging.ERROR, logger="npusim.acl"):
        for _ in range(3):
            assert acl.rt.free(0x1234) != 0
    logged = [r for r in caplog.records if "acl.rt.free failed" in r.getMessage()]
    assert len(logged) == 1
    message = acl.get_recent_err_msg()
    assert message.count("free:") == 1 and acl.get_recent_err_msg() is None     # kept once, then cleared


def test_an_internal_error_becomes_a_code_never_an_escape(acl0, monkeypatch):
    monkeypatch.setattr(rt, "create_stream", lambda: 1 / 0)
    stream, ret = acl.rt.create_stream()
    assert (stream, ret) == (0, 500000)
    assert "internal error in npusim: ZeroDivisionError" in acl.get_recent_err_msg()


# ---------------------------------------------------------------- host addresses
def test_bytes_region_lives_while_the_program_holds_the_bytes():
    regions = HostRegions()
    kept = bytes(100)
    p = regions.add_bytes(kept)
    regions.add_bytes(bytes(200))                    # dropped at once by the caller
    regions._sweep()
    assert regions.lookup(p, 100, "t", "dst")[1] is kept
    assert len(regions._regions) == 1
    arr = np.zeros(8, np.int32)
    q = regions.add_array(arr)
    del arr
    gc.collect()
    assert regions.lookup(q, 4, "t", "src") is None         # forgotten: its memory is judged by the memory map
    assert len(regions._regions) == 1


def test_writing_into_bytes_and_reading_back_with_ptr_helpers(acl0):
    dev, ret = acl.rt.malloc(16, 0)
    src = np.arange(4, dtype=np.int32)
    assert acl.rt.memcpy(dev, 16, acl.util.numpy_to_ptr(src), 16, 1) == 0
    out = bytes(16)
    ptr = acl.util.bytes_to_ptr(out)
    assert acl.rt.memcpy(ptr, 16, dev, 16, 2) == 0
    assert np.frombuffer(out, np.int32).tolist() == [0, 1, 2, 3]
    assert acl.util.ptr_to_bytes(ptr + 4, 4) == np.int32(1).tobytes()
    view = acl.util.ptr_to_numpy(ptr, (2, 2), 5)
    assert view.tolist() == [[0, 1], [2, 3]]
    buf = bytearray(16)
    assert acl.rt.memcpy(acl.util.bytes_to_ptr(buf), 16, dev, 16, 2) == 0
    assert bytes(buf) == out
    buf_ptr = acl.util.bytes_to_ptr(buf)
    buf.extend(bytes(4096))                                             # resized: its storage may have moved
    assert acl.rt.memcpy(buf_ptr, 16, dev, 16, 2) == 107000
    assert "was resized since bytes_to_ptr" in acl.get_recent_err_msg()
    p, contiguous = acl.util.numpy_contiguous_to_ptr(np.arange(8, dtype=np.int32)[::2])
    assert acl.rt.memcpy(dev, 16, p, 16, 1) == 0 and contiguous.tolist() == [0, 2, 4, 6]
    assert acl.util.ptr_to_numpy(ptr, (2,), 99) is None                 # NumPy type 99 does not exist
    assert "NumPy type number 99" in acl.get_recent_err_msg()
    with pytest.raises(ValueError):                                     # as pyACL's binding raises
        acl.util.bytes_to_ptr("text")
    assert acl.rt.free(dev) == 0


def test_malloc_host_addresses_and_their_misuse(acl0):
    host, ret = acl.rt.malloc_host(256)
    assert ret == 0 and isinstance(host, int)
    assert acl.rt.memset(host, 256, 3, 256) == 0
    assert acl.util.ptr_to_bytes(host + 250, 6) == b"\x03" * 6
    assert acl.util.ptr_to_bytes(host + 250, 7) == b""                  # one past the end
    assert "1 bytes past the end of the 256-byte region" in acl.get_recent_err_msg()
    assert acl.rt.free_host(host + 1) == 107000
    assert "1 bytes into the 256-byte region" in acl.get_recent_err_msg()
    assert acl.rt.free_host(host) == 0
    assert acl.rt.free_host(host) == 207002
    assert acl.rt.memset(host, 256, 0, 1) == 107000
    assert "use after free" in acl.get_recent_err_msg()
    assert acl.rt.free_host("0x10") == 100000


def test_load_from_mem_reads_the_host_address(acl0, tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    import acl_standin
    path = tmp_path / "m.om"
    acl_standin.build(str(path), None, hw=4)
    data = path.read_bytes()
    model_id, ret = acl.mdl.load_from_mem(acl.util.bytes_to_ptr(data), len(data))
    assert ret == 0
    assert acl.mdl.load_from_mem(acl.util.bytes_to_ptr(data), len(data) + 1)[1] == 107000    # past the end
    work, weight, ret = acl.mdl.query_size(str(path))          # work: the intermediates' bytes, never 0
    assert (weight, ret) == ((3 * 1000 + 1000) * 4, 0) and work >= 3 * 4 + 1000 * 4
    assert acl.mdl.unload(model_id) == 0 and acl.mdl.unload(model_id) != 0


# ---------------------------------------------------------------- callbacks
def test_callbacks_run_on_the_subscribed_thread_in_stream_order(acl0):
    ctx, _ = acl.rt.get_context()
    stream, _ = acl.rt.create_stream()
    seen, stop = [], threading.Event()

    def loop(args):
        assert acl.rt.set_context(args[0]) == 0
        while not stop.is_set():
            acl.rt.process_report(20)

    tid, ret = acl.util.start_thread(loop, [ctx])
    assert ret == 0 and acl.rt.subscribe_report(tid, stream) == 0
    assert acl.rt.subscribe_report(tid, stream) == 107011                # already subscribed
    host, _ = acl.rt.malloc_host(4)
    for i in range(5):
        assert acl.rt.memset_async(host, 4, i, 4, stream) == 0
        # a blocking callback sees the memset before it, and holds the stream until it has run
        assert acl.rt.launch_callback(lambda v: seen.append((v, acl.util.ptr_to_bytes(host, 1)[0],
                                                             threading.get_native_id())), i, 1, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert [(v, b) for v, b, _ in seen] == [(i, i) for i in range(5)]
    assert {t for _, _, t in seen} == {tid}
    assert acl.rt.unsubscribe_report(tid, stream) == 0
    assert acl.rt.unsubscribe_report(tid, stream) == 107011
    stop.set()
    assert acl.util.stop_thread(tid) == 0 and acl.util.stop_thread(tid) == 100000
    assert acl.rt.free_host(host) == 0 and acl.rt.destroy_stream(stream) == 0


def test_process_report_codes(acl0, caplog):
    assert acl.rt.process_report(10) == 107012                          # this thread subscribed to nothing
    assert "subscribe_report" in acl.get_recent_err_msg()
    stream, _ = acl.rt.create_stream()
    me = threading.get_native_id()
    assert acl.rt.subscribe_report(me, stream) == 0
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="npusim.acl"):
        assert acl.rt.process_report(10) == 507012                      # nothing due: a timeout, not logged
    assert not caplog.records
    assert acl.rt.launch_callback(lambda _: 1 / 0, None, 0, stream) == 0   # non-blocking, raises when run
    assert acl.rt.synchronize_stream(stream) == 0
    with caplog.at_level(logging.ERROR, logger="npusim.acl"):
        assert acl.rt.process_report(1000) == 0                         # the callback raised: reported, not fatal
    assert "raised ZeroDivisionError" in acl.get_recent_err_msg()
    assert any(r.exc_info for r in caplog.records)
    assert acl.rt.process_report("soon") == 100000 and acl.rt.process_report(0) == 100000    # CANN: -1 or > 0
    assert acl.rt.unsubscribe_report(me, stream) == 0 and acl.rt.destroy_stream(stream) == 0


def test_a_callback_on_a_stream_nobody_subscribed_to_is_refused(acl0):
    """CANN's runtime refuses it (RT_ERROR_STREAM_NO_CB_REG): ACL_ERROR_RT_STREAM_NO_CB_REG, and nothing runs."""
    ran = threading.Event()
    assert acl.rt.launch_callback(lambda _: ran.set(), None, 1, 0) == 107015
    assert "subscribe_report" in acl.get_recent_err_msg()
    assert acl.rt.synchronize_stream(0) == 0 and not ran.is_set()


def test_a_blocking_callback_for_a_thread_that_ended_fails_the_stream_instead_of_hanging(acl0):
    stream, _ = acl.rt.create_stream()
    tid, ret = acl.util.start_thread(lambda _: None, None)              # ends at once, never reports
    assert acl.util.stop_thread(tid) == 0 and acl.rt.subscribe_report(tid, stream) == 0
    assert acl.rt.launch_callback(lambda _: None, None, 1, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 507012
    assert f"thread {tid}, subscribed to the stream, ended" in acl.get_recent_err_msg()
    assert acl.rt.unsubscribe_report(tid, stream) == 0


def test_a_default_stream_subscription_is_the_contexts_not_every_later_ones(acl0):
    """Subscribing to stream 0 binds the current context's default stream; a thread that ended while subscribed
    (a program that never unsubscribed) must not capture the default-stream callbacks of a later context."""
    tid, _ = acl.util.start_thread(lambda _: None, None)
    assert acl.util.stop_thread(tid) == 0 and acl.rt.subscribe_report(tid, 0) == 0
    ctx, ret = acl.rt.create_context(0)                    # another context: its default stream is not subscribed
    assert ret == 0 and acl.rt.set_context(ctx) == 0
    ran = threading.Event()
    assert acl.rt.launch_callback(lambda _: ran.set(), None, 1, 0) == 107015     # not the dead thread's stream
    assert acl.rt.synchronize_stream(0) == 0 and not ran.is_set()
    me = threading.get_native_id()
    assert acl.rt.subscribe_report(me, 0) == 0                                   # this context's default stream
    assert acl.rt.launch_callback(lambda _: ran.set(), None, 0, 0) == 0
    assert acl.rt.synchronize_stream(0) == 0 and acl.rt.process_report(1000) == 0 and ran.is_set()
    assert acl.rt.unsubscribe_report(me, 0) == 0
    assert acl.rt.destroy_context(ctx) == 0


def test_memory_codes_follow_canns_runtime(acl0):
    """As CANN's aclrt*Impl functions check: a null pointer is ACL_ERROR_INVALID_PARAM (checked first); a count
    past dest_max / max_count is the runtime's ACL_ERROR_RT_PARAM_INVALID; memset's value is a C int32 whose low
    byte fills; an unknown malloc policy takes the default; aclrtMemAttr runs to ACL_MEM_P2P_HUGE1G (17)."""
    ptr, ret = acl.rt.malloc(64, 77)
    assert ret == 0 and ptr
    assert acl.rt.free(0) == 100000 and acl.rt.free_host(0) == 100000
    assert acl.rt.memcpy(0, 64, ptr, 64, 3) == 100000 and acl.rt.memcpy(ptr, 64, 0, 0, 3) == 100000
    assert acl.rt.memset(0, 0, 0, 0) == 100000
    host = bytearray(64)
    hptr = acl.util.bytes_to_ptr(host)
    assert acl.rt.memcpy(ptr, 32, hptr, 64, 1) == 107000
    assert acl.rt.memset(ptr, 32, 0, 64) == 107000
    for value, byte in ((-1, 0xFF), (0x101, 0x01), (7, 7)):
        assert acl.rt.memset(ptr, 64, value, 64) == 0
        assert acl.rt.memcpy(hptr, 64, ptr, 64, 2) == 0 and set(host) == {byte}
    assert acl.rt.memset(ptr, 64, 1 << 40, 64) == 100000              # not a C int32
    for attr in range(18):
        free_, total, ret = acl.rt.get_mem_info(attr)
        assert ret == 0 and 0 < free_ <= total, attr
    assert acl.rt.get_mem_info(18)[2] == 100000
    assert acl.rt.free(ptr) == 0
