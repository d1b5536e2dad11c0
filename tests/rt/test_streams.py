"""Streams, events, callbacks, async errors and contexts on in-process cards.

Ordering is checked against a numpy replay of the same operation sequence; "runs later" is shown
with stream_query / event status right after the enqueue, never with wall-clock assertions.
"""

import threading
import time

import numpy as np
import pytest

import rt

pytestmark = pytest.mark.timeout(60, method="signal")   # a hang fails the test; teardown still runs

KiB, MiB = 1 << 10, 1 << 20
INVALID_PARAM, RT_PARAM, CONTEXT_NULL, INVALID_HANDLE = 100000, 107000, 107002, 107017
SYNC_TIMEOUT, AICORE = 507046, 507015
H2D, D2H, D2D = 1, 2, 3
NOT_READY, COMPLETE = rt.ACL_STREAM_STATUS_NOT_READY, rt.ACL_STREAM_STATUS_COMPLETE


def raises(code, fn, *args, **kwargs) -> str:
    with pytest.raises(rt.AclError) as info:
        fn(*args, **kwargs)
    assert info.value.code == code, info.value
    return info.value.message


def download(ptr: int, nbytes: int, dtype=np.uint8) -> np.ndarray:
    out = np.empty(nbytes, np.uint8)
    rt.memcpy(out, nbytes, ptr, nbytes, D2H)
    return out.view(dtype)


@rt.kernel
def mix(acc, slot, out):
    """acc = acc * 3 + slot (uint32 wrap-around): the result depends on the order of every step."""
    out[...] = acc * np.uint32(3) + slot


@rt.kernel
def fail_kernel(x, out):
    raise ValueError("deliberate failure in a user kernel")


# ====================================================================== ordering under load
def run_chain(stream, seed: int, steps: int = 300, n: int = 64) -> None:
    """Enqueue a random mix of small copies, memsets and kernels on ``stream``; compare with numpy."""
    rng = np.random.default_rng(seed)
    acc = rt.Tensor.from_numpy(np.zeros(n, np.uint32))
    slot = rt.empty(n, np.uint32)
    spare = rt.empty(n, np.uint32)
    want_acc, want_slot, want_spare = np.zeros(n, np.uint32), np.zeros(n, np.uint32), np.zeros(n, np.uint32)
    rt.memset_async(slot.ptr, slot.nbytes, 0, slot.nbytes, stream)
    rt.memset_async(spare.ptr, spare.nbytes, 0, spare.nbytes, stream)
    for _ in range(steps):
        op = rng.integers(0, 4)
        if op == 0:                                       # pageable H2D into slot
            data = rng.integers(0, 1 << 32, n, dtype=np.uint32)
            rt.memcpy_async(slot.ptr, slot.nbytes, data, data.nbytes, H2D, stream)
            want_slot[:] = data
        elif op == 1:                                     # kernel: acc = acc * 3 + slot
            rt.launch_kernel(mix, [acc, slot], [acc], stream=stream)
            want_acc[:] = want_acc * np.uint32(3) + want_slot
        elif op == 2:                                     # memset a byte pattern into slot
            v = int(rng.integers(0, 256))
            rt.memset_async(slot.ptr, slot.nbytes, v, slot.nbytes, stream)
            want_slot[:] = np.full(n * 4, v, np.uint8).view(np.uint32)
        else:                                             # D2D: spare <- acc, slot <- spare
            rt.memcpy_async(spare.ptr, spare.nbytes, acc.ptr, acc.nbytes, D2D, stream)
            rt.memcpy_async(slot.ptr, slot.nbytes, spare.ptr, spare.nbytes, D2D, stream)
            want_spare[:] = want_acc
            want_slot[:] = want_spare
    rt.synchronize_stream(stream)
    assert np.array_equal(download(acc.ptr, acc.nbytes, np.uint32), want_acc)
    assert np.array_equal(download(slot.ptr, slot.nbytes, np.uint32), want_slot)


def test_order_holds_on_one_stream(dev0):
    run_chain(rt.create_stream(), seed=1, steps=600)


def test_order_holds_on_the_default_stream(dev0):
    run_chain(None, seed=2, steps=200)


def test_order_holds_per_stream_from_several_threads(rt_local):
    rt.set_device(0)
    failures = []

    def worker(seed):
        try:
            rt.set_device(0)
            run_chain(rt.create_stream(), seed=seed, steps=200)
        except BaseException as e:  # reported below: a thread's assert must fail the test
            failures.append((seed, e))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(10, 14)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(50)
    assert not any(t.is_alive() for t in threads)
    assert not failures, failures


# ====================================================================== streams
def test_default_stream_none_and_zero_are_the_same(dev0):
    ptr = rt.malloc(4 * KiB)
    rt.sleep_kernel(0.2, None)
    rt.memset_async(ptr, 4 * KiB, 9, 4 * KiB, 0)
    assert rt.stream_query(0) == NOT_READY
    rt.synchronize_stream(None)
    assert rt.stream_query(None) == COMPLETE
    assert (download(ptr, 4 * KiB) == 9).all()


def test_enqueue_returns_before_a_long_kernel_finishes(dev0):
    s = rt.create_stream()
    rt.sleep_kernel(1.0, s)
    assert rt.stream_query(s) == NOT_READY
    rt.synchronize_stream(s)
    assert rt.stream_query(s) == COMPLETE


def test_synchronize_with_timeout(dev0):
    s = rt.create_stream()
    rt.sleep_kernel(1.0, s)
    msg = raises(SYNC_TIMEOUT, rt.synchronize_stream_with_timeout, s, 100)
    assert "100 ms" in msg
    raises(SYNC_TIMEOUT, rt.synchronize_stream_with_timeout, s, 0)      # 0: check now, busy
    raises(INVALID_PARAM, rt.synchronize_stream_with_timeout, s, -2)
    rt.synchronize_stream_with_timeout(s, -1)                           # -1: wait without limit
    assert rt.stream_query(s) == COMPLETE
    rt.synchronize_stream_with_timeout(s, 0)                            # idle: returns at once
    rt.sleep_kernel(0.05, s)
    rt.synchronize_stream_with_timeout(s, 10_000)


def test_synchronize_device_waits_for_every_stream(dev0):
    streams = [rt.create_stream() for _ in range(3)]
    ptrs = [rt.malloc(KiB) for _ in streams]
    for i, (s, p) in enumerate(zip(streams, ptrs)):
        rt.sleep_kernel(0.1 * (i + 1), s)
        rt.memset_async(p, KiB, i + 1, KiB, s)
    rt.memset_async(ptrs[0], 16, 77, 16, None)       # the default stream counts too
    rt.synchronize_device()
    assert all(rt.stream_query(s) == COMPLETE for s in streams)
    assert (download(ptrs[1], KiB) == 2).all() and (download(ptrs[2], KiB) == 3).all()


def test_streams_run_concurrently_on_a_card(dev0):
    a, b = rt.create_stream(), rt.create_stream()
    rt.sleep_kernel(1.0, a)
    ptr = rt.malloc(64)
    rt.memset_async(ptr, 64, 5, 64, b)
    rt.synchronize_stream(b)                         # does not wait for stream a's long kernel
    assert rt.stream_query(a) == NOT_READY
    assert (download(ptr, 64) == 5).all()


def test_destroyed_handles(dev0):
    s = rt.create_stream()
    rt.destroy_stream(s)
    for fn, args in ((rt.synchronize_stream, (s,)), (rt.stream_query, (s,)), (rt.destroy_stream, (s,)),
                     (rt.sleep_kernel, (0.01, s)), (rt.memset_async, (rt.malloc(8), 8, 0, 8, s))):
        raises(INVALID_HANDLE, fn, *args)
    e = rt.create_event()
    rt.destroy_event(e)
    for fn, args in ((rt.record_event, (e, None)), (rt.query_event_status, (e,)), (rt.synchronize_event, (e,)),
                     (rt.stream_wait_event, (None, e)), (rt.destroy_event, (e,))):
        raises(INVALID_HANDLE, fn, *args)
    raises(INVALID_PARAM, rt.destroy_stream, None)                   # the default stream stays
    raises(INVALID_PARAM, rt.synchronize_stream, "stream")
    raises(INVALID_PARAM, rt.record_event, object(), None)


def test_stream_destroy_lets_queued_work_finish(dev0):
    s = rt.create_stream()
    ptr = rt.malloc(KiB)
    rt.sleep_kernel(0.1, s)
    rt.memset_async(ptr, KiB, 3, KiB, s)
    rt.destroy_stream(s)
    e = rt.create_event()
    other = rt.create_stream()
    rt.sleep_kernel(0.3, other)                # give the destroyed stream time to drain
    rt.record_event(e, other)
    rt.synchronize_event(e)
    assert (download(ptr, KiB) == 3).all()


# ====================================================================== events
def test_event_orders_a_stream_after_another(dev0):
    copy_s, compute_s = rt.create_stream(), rt.create_stream()
    src, dst = rt.malloc(MiB), rt.malloc(MiB)
    rt.memset(dst, MiB, 0, MiB)
    done = rt.create_event()
    rt.sleep_kernel(0.3, copy_s)
    rt.memset_async(src, MiB, 0x5A, MiB, copy_s)
    rt.record_event(done, copy_s)
    rt.stream_wait_event(compute_s, done)
    rt.memcpy_async(dst, MiB, src, MiB, D2D, compute_s)
    assert rt.query_event_status(done) == rt.ACL_EVENT_RECORDED_STATUS_NOT_READY
    rt.synchronize_stream(compute_s)
    assert rt.query_event_status(done) == rt.ACL_EVENT_RECORDED_STATUS_COMPLETE
    assert (download(dst, MiB) == 0x5A).all()


def test_event_orders_streams_across_two_cards(rt_local):
    rt.set_device(0)
    s0 = rt.create_stream()
    src = rt.malloc(64 * KiB)
    ev = rt.create_event()
    rt.sleep_kernel(0.3, s0)
    rt.memset_async(src, 64 * KiB, 0x33, 64 * KiB, s0)
    rt.record_event(ev, s0)
    rt.set_device(1)
    s1 = rt.create_stream()
    dst = rt.malloc(64 * KiB)
    rt.memset(dst, 64 * KiB, 0, 64 * KiB)
    rt.stream_wait_event(s1, ev)                         # card 1 waits for card 0's event
    rt.memcpy_async(dst, 64 * KiB, src, 64 * KiB, D2D, s1)
    assert rt.stream_query(s1) == NOT_READY
    rt.synchronize_stream(s1)
    assert (download(dst, 64 * KiB) == 0x33).all()
    raises(rt.ACL_ERROR_RT_STREAM_CONTEXT, rt.record_event, ev, s1)   # an event records on its own card


def test_event_status_enums_and_reset(dev0):
    assert (rt.ACL_EVENT_RECORDED_STATUS_NOT_READY, rt.ACL_EVENT_RECORDED_STATUS_COMPLETE) == (0, 1)
    assert (rt.ACL_EVENT_STATUS_COMPLETE, rt.ACL_EVENT_STATUS_NOT_READY) == (0, 1)
    assert (rt.ACL_STREAM_STATUS_COMPLETE, rt.ACL_STREAM_STATUS_NOT_READY) == (0, 1)
    s = rt.create_stream()
    e = rt.create_event()
    assert rt.query_event_status(e) == 0              # never recorded
    rt.sleep_kernel(0.2, s)
    rt.record_event(e, s)
    assert rt.query_event_status(e) == 0
    rt.synchronize_event(e)
    assert rt.query_event_status(e) == 1
    rt.reset_event(e, s)
    rt.synchronize_stream(s)
    assert rt.query_event_status(e) == 0
    rt.record_event(e, s)                             # usable again after a reset
    rt.synchronize_stream(s)
    assert rt.query_event_status(e) == 1


def test_event_elapsed_time_measures_the_card(dev0):
    s = rt.create_stream()
    start, end = rt.create_event(), rt.create_event()
    rt.record_event(start, s)
    rt.sleep_kernel(0.2, s)
    rt.record_event(end, s)
    raises(rt.ACL_ERROR_RT_EVENT_NOT_COMPLETE, rt.event_elapsed_time, start, end)   # end not reached yet
    rt.synchronize_event(end)
    ms = rt.event_elapsed_time(start, end)
    assert isinstance(ms, float) and 150 <= ms < 5000
    assert rt.event_elapsed_time(end, start) < 0


# ====================================================================== callbacks
def test_blocking_callback_holds_the_stream(dev0):
    s = rt.create_stream()
    pinned = rt.malloc_host(4 * KiB)
    host = np.frombuffer(pinned, np.uint32)
    host[:] = 1
    ptr = rt.malloc(4 * KiB)
    threads = []

    def write_pattern(value):
        threads.append(threading.current_thread())
        host[:] = value                                # the stream must not move on before this

    rt.sleep_kernel(0.1, s)
    rt.launch_callback(write_pattern, 0xC0FFEE, True, s)
    rt.memcpy_async(ptr, 4 * KiB, pinned, 4 * KiB, H2D, s)
    rt.synchronize_stream(s)
    assert (download(ptr, 4 * KiB, np.uint32) == 0xC0FFEE).all()
    assert threads and threads[0] is not threading.current_thread()
    del host
    rt.free_host(pinned)


def test_blocking_callback_runs_after_prior_work(dev0):
    s = rt.create_stream()
    ptr = rt.malloc(64)
    seen = []
    rt.sleep_kernel(0.1, s)
    rt.memset_async(ptr, 64, 42, 64, s)
    rt.launch_callback(lambda p: seen.append(download(p, 64).copy()), ptr, True, s)
    rt.synchronize_stream(s)
    assert len(seen) == 1 and (seen[0] == 42).all()


def test_non_blocking_callback(dev0):
    s = rt.create_stream()
    ran = threading.Event()
    got = []
    rt.sleep_kernel(0.1, s)
    rt.launch_callback(lambda d: (got.append(d), ran.set()), {"k": 1}, False, s)
    assert not ran.is_set()
    rt.synchronize_stream(s)
    assert ran.wait(10) and got == [{"k": 1}]
    raises(INVALID_PARAM, rt.launch_callback, "not callable", None, True, s)


def test_a_blocking_callback_that_fails_an_acl_call_fails_its_stream(dev0):
    s = rt.create_stream()
    rt.launch_callback(lambda ptr: rt.free(ptr), 0x1234, True, s)        # free of a bad address: 107000
    after = rt.malloc(64)
    rt.memset_async(after, 64, 7, 64, s)
    message = raises(rt.ACL_ERROR_RT_PARAM_INVALID, rt.synchronize_stream, s)
    assert "free" in message
    rt.free(after)


# ====================================================================== async failures
def test_kernel_failure_raised_at_next_synchronize(dev0):
    s = rt.create_stream()
    x, out = rt.Tensor.from_numpy(np.ones(4, np.float32)), rt.empty(4, np.float32)
    rt.get_recent_err_msg()
    rt.launch_kernel(fail_kernel, [x], [out], stream=s)            # returns: the failure is later
    msg = raises(AICORE, rt.synchronize_stream, s)
    assert "kernel#" in msg and "deliberate failure" in msg
    recent = rt.get_recent_err_msg()
    assert recent is not None and "deliberate failure" in recent
    assert recent.count("deliberate failure") == 1                  # recorded once, not per layer
    assert rt.get_recent_err_msg() is None                          # read-and-clear
    rt.synchronize_stream(s)                                        # the error was reported once
    rt.launch_kernel(mix, [rt.Tensor.from_numpy(np.ones(4, np.uint32))] * 2,
                     [rt.empty(4, np.uint32)], stream=s)
    rt.synchronize_stream(s)                                        # the stream still works


def test_async_copy_to_freed_address_reported_with_task(dev0):
    s = rt.create_stream()
    ptr = rt.malloc(KiB)
    rt.free(ptr)
    rt.memcpy_async(ptr, KiB, np.zeros(KiB, np.uint8), KiB, H2D, s)
    msg = raises(RT_PARAM, rt.synchronize_stream, s)
    assert "memcpy#" in msg and "use after free" in msg and f"{ptr:#x}" in msg
    assert "use after free" in rt.get_recent_err_msg()
    good = rt.malloc(KiB)
    rt.memset_async(good, KiB, 1, KiB, s)
    rt.synchronize_stream(s)


def test_async_failure_reported_by_synchronize_device(dev0):
    s = rt.create_stream()
    x, out = rt.Tensor.from_numpy(np.ones(4, np.float32)), rt.empty(4, np.float32)
    rt.launch_kernel(fail_kernel, [x], [out], stream=s)
    raises(AICORE, rt.synchronize_device)
    rt.synchronize_device()


# ====================================================================== contexts
def test_contexts_create_set_destroy(rt_local):
    rt.set_device(0)
    default = rt.get_context()
    ctx = rt.create_context(1)
    assert rt.get_context() is ctx and rt.get_device() == 1
    ptr = rt.malloc(3 * MiB)
    s = rt.create_stream()
    assert rt.get_mem_info()[0] < 2 << 30
    rt.set_context(default)
    assert rt.get_device() == 0
    rt.set_context(ctx)
    rt.memset(ptr, 64, 1, 64)
    rt.destroy_context(ctx)
    raises(CONTEXT_NULL, rt.set_context, ctx)
    raises(INVALID_HANDLE, rt.synchronize_stream, s)                # its streams went with it
    raises(INVALID_PARAM, rt.destroy_context, default)              # default: released by reset_device
    raises(INVALID_PARAM, rt.set_context, "ctx")
    rt.set_context(default)
    rt.set_device(1)
    assert rt.get_mem_info()[0] == 2 << 30                          # its memory went with it


def test_released_contexts_leave_no_host_threads(rt_local):
    rt.set_device(0)
    rt.reset_device(0)
    before = threading.active_count()
    for _ in range(10):
        rt.set_device(0)
        rt.launch_callback(lambda d: None, None, True, None)
        rt.synchronize_stream(None)
        rt.reset_device(0)
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before
