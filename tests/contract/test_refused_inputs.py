"""Issue #21 item 4: inputs that were silently accepted are refused with CANN's code — and their neighbours
(every destroy twice, every enqueueing call with another card's stream, every dtype=None, size 2**64)."""

import numpy as np
import pytest

import hccl
from rt.constants import AclErrorCode as E

GIANT = 10 ** 5000                    # repr() of it raises ValueError (Python's int-to-str digit limit)


@pytest.fixture
def two_cards(dev0):
    """(rt, a stream of device 1) with device 0 current."""
    rt = dev0
    rt.set_device(1)
    other = rt.create_stream()
    rt.set_device(0)
    return rt, other


def _code(fn, *a, **kw):
    import rt
    with pytest.raises(rt.NpuError) as info:
        fn(*a, **kw)
    return info.value.code


# ---------------------------------------------------------------- destroy twice
def test_destroy_context_twice_is_context_null(dev0):
    rt = dev0
    ctx = rt.create_context(0)
    rt.destroy_context(ctx)
    assert _code(rt.destroy_context, ctx) == E.ACL_ERROR_RT_CONTEXT_NULL
    rt.set_device(0)
    ptr = rt.malloc(64)                                  # the runtime still works
    rt.free(ptr)


def test_every_destroy_twice_is_refused(dev0):
    rt = dev0
    for make, destroy in ((rt.create_stream, rt.destroy_stream), (rt.create_event, rt.destroy_event),
                          (lambda: rt.malloc(64), rt.free), (lambda: rt.malloc_host(64), rt.free_host),
                          (lambda: rt.mdl.create_data_buffer(0, 0), rt.mdl.destroy_data_buffer),
                          (rt.mdl.create_dataset, rt.mdl.destroy_dataset)):
        handle = make()
        destroy(handle)
        assert _code(destroy, handle) > 0, destroy.__name__
    comm, = hccl.comm_init_all([0])
    hccl.comm_destroy(comm)
    assert _code(hccl.comm_destroy, comm) == hccl.HCCL_E_PARA


# ---------------------------------------------------------------- a stream of another card
def test_enqueueing_on_another_cards_stream_is_stream_context(two_cards):
    rt, other = two_cards
    a, b = rt.malloc(4096), rt.malloc(4096)
    host = np.zeros(4096, np.uint8)
    t = rt.empty((2, 4))
    calls = {
        "memcpy_async d2d": lambda: rt.memcpy_async(a, 4096, b, 4096, rt.ACL_MEMCPY_DEVICE_TO_DEVICE, other),
        "memcpy_async h2d": lambda: rt.memcpy_async(a, 4096, host, 4096, rt.ACL_MEMCPY_HOST_TO_DEVICE, other),
        "memcpy_async d2h": lambda: rt.memcpy_async(host, 4096, a, 4096, rt.ACL_MEMCPY_DEVICE_TO_HOST, other),
        "memset_async": lambda: rt.memset_async(a, 4096, 1, 4096, other),
        "launch_callback": lambda: rt.launch_callback(lambda _: None, None, True, other),
        "launch_kernel": lambda: rt.launch_kernel("Relu", [t], [t], stream=other),
        "sleep_kernel": lambda: rt.sleep_kernel(0.0, other),
    }
    for name, call in calls.items():
        assert _code(call) == E.ACL_ERROR_RT_STREAM_CONTEXT, name
    rt.synchronize_device()
    rt.set_device(1)                                     # the stream works on its own card
    rt.memset_async(rt.malloc(64), 64, 1, 64, other)
    rt.synchronize_stream(other)


def test_acl_memcpy_async_with_another_cards_stream_returns_107003(monkeypatch):
    import acl
    import rt
    monkeypatch.setenv("NPUSIM_BACKEND", "local")
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    assert acl.init() == 0
    try:
        assert acl.rt.set_device(1) == 0
        other, ret = acl.rt.create_stream()
        assert acl.rt.set_device(0) == 0
        dev, _ = acl.rt.malloc(64, 0)
        src, _ = acl.rt.malloc(64, 0)
        assert acl.rt.memcpy_async(dev, 64, src, 64, 3, other) == E.ACL_ERROR_RT_STREAM_CONTEXT
        assert acl.rt.memset_async(dev, 64, 0, 64, other) == E.ACL_ERROR_RT_STREAM_CONTEXT
        assert "not on the current context's card" in acl.get_recent_err_msg()
    finally:
        rt.finalize()


# ---------------------------------------------------------------- dtype=None
def test_dtype_none_is_refused_everywhere(dev0):
    rt = dev0
    ptr = rt.malloc(4096)
    comm, = hccl.comm_init_all([0])
    assert _code(rt.empty, (4,), dtype=None) == E.ACL_ERROR_UNSUPPORTED_DATA_TYPE
    assert _code(rt.Tensor, ptr, (4,), None) == E.ACL_ERROR_UNSUPPORTED_DATA_TYPE
    for call in (lambda: hccl.all_reduce(ptr, ptr, 4, None, "sum", comm),
                 lambda: hccl.broadcast(ptr, 4, None, 0, comm),
                 lambda: hccl.all_gather(ptr, ptr, 4, None, comm),
                 lambda: hccl.reduce_scatter(ptr, ptr, 4, None, "sum", comm),
                 lambda: hccl.all_to_all(ptr, 4, None, ptr + 2048, 4, None, comm)):
        assert _code(call) == hccl.HCCL_E_PARA
    assert rt.empty((4,)).dtype == np.float32                        # the default is still float32


# ---------------------------------------------------------------- data buffers
HOST = np.zeros(64, np.uint8)


@pytest.mark.parametrize("ptr, size, what", [
    ("dev", 2 ** 64, "size"), ("dev", 2 ** 63, "size"), ("host", 64, "not a device address"),
    ("pinned", 64, "not a device address"), ("dev", GIANT, "size"), (GIANT, 64, "ptr"),
], ids=["size2**64", "size2**63", "host-int", "pinned-int", "size-giant", "ptr-giant"])
def test_data_buffer_needs_a_device_address_and_an_int64_size(dev0, ptr, size, what):
    rt = dev0
    pinned = rt.malloc_host(64)                              # held: its address stays mapped
    ptr = {"dev": lambda: rt.malloc(64), "host": lambda: HOST.ctypes.data,
           "pinned": lambda: pinned.address}.get(ptr, lambda: ptr)()
    with pytest.raises(rt.AclError) as info:
        rt.mdl.create_data_buffer(ptr, size)
    assert info.value.code == E.ACL_ERROR_INVALID_PARAM and what in info.value.message
    buf = rt.mdl.create_data_buffer(rt.malloc(64), 64)
    with pytest.raises(rt.AclError):
        rt.mdl.update_data_buffer(buf, ptr, size)
    assert rt.mdl.create_data_buffer(0, 0).size == 0                  # the empty buffer stays valid


# ---------------------------------------------------------------- all_to_all buffers
def test_all_to_all_v_checks_the_real_ranges(dev0):
    rt = dev0
    comm, = hccl.comm_init_all([0])
    p = rt.malloc(4096)
    # send [p, p + 16), recv [p + 16, p + 416): adjacent, not overlapping (refused before: max of the sizes)
    hccl.all_to_all_v(p, [4], [0], "fp32", p + 16, [4], [96], "fp32", comm)
    rt.synchronize_device()
    with pytest.raises(hccl.HcclError) as info:
        hccl.all_to_all_v(p, [4], [0], "fp32", p + 12, [4], [0], "fp32", comm)
    assert info.value.code == hccl.HCCL_E_PARA and "overlap" in info.value.message
    with pytest.raises(hccl.HcclError, match="overlap"):
        hccl.all_to_all(p, 4, "fp32", p + 8, 4, "fp32", comm)


# ---------------------------------------------------------------- integers past repr()'s limit
def test_giant_ints_are_named_errors_not_value_errors(dev0):
    rt = dev0
    comm, = hccl.comm_init_all([0])
    calls = [lambda: rt.empty((4,), GIANT), lambda: rt.set_device(GIANT), lambda: rt.destroy_context(GIANT),
             lambda: rt.set_context(GIANT), lambda: rt.synchronize_stream(GIANT), lambda: rt.destroy_event(GIANT),
             lambda: rt.memset(rt.malloc(64), 64, GIANT, 64), lambda: hccl.get_rank_id(GIANT),
             lambda: hccl.comm_init_root_info(2, hccl.get_root_info(), GIANT),
             lambda: hccl.all_reduce(rt.malloc(64), rt.malloc(64), 4, GIANT, "sum", comm),
             lambda: hccl.all_reduce(rt.malloc(64), rt.malloc(64), 4, "fp32", GIANT, comm),
             lambda: hccl.broadcast(rt.malloc(64), 4, "fp32", GIANT, comm),
             lambda: rt.launch_kernel(GIANT, [], []), lambda: rt.synchronize_stream_with_timeout(None, GIANT)]
    for i, call in enumerate(calls):
        with pytest.raises(rt.NpuError) as info:
            call()
        assert "bit int" in info.value.message, (i, info.value.message)
