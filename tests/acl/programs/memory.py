"""Memory management the way CANN's samples do it: device and pinned host memory as int addresses, copies
both ways (into a bytes object through bytes_to_ptr, read back with np.frombuffer), host memset, a wrong
memcpy kind, asynchronous copies on two streams ordered by an event, and the failures pyACL reports with a
code (bad pointers, double frees, out of memory) instead of crashing.

    python memory.py
"""
import warnings

import numpy as np

import acl

ACL_SUCCESS = 0
ACL_MEM_MALLOC_HUGE_FIRST, ACL_MEM_MALLOC_NORMAL_ONLY = 0, 2
ACL_MEMCPY_HOST_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_DEVICE_TO_DEVICE = 0, 1, 2, 3
ACL_DDR_MEM, ACL_HBM_MEM = 0, 1
NPY_FLOAT32, NPY_INT32 = 11, 5


def check(ret, what):
    if ret != ACL_SUCCESS:
        raise RuntimeError(f"{what} failed, ret={ret}: {acl.get_recent_err_msg()}")


def expect(ret, code, what):
    assert ret == code, f"{what}: expected {code}, got {ret}"
    message = acl.get_recent_err_msg()
    assert message, f"{what}: no error message kept"
    return message


def main():
    assert "bytes_to_ptr" in dir(acl.util)              # the feature probe programs make
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(0), "set_device")
    context, ret = acl.rt.create_context(0)
    check(ret, "create_context")
    free, total, ret = acl.rt.get_mem_info(ACL_HBM_MEM)
    check(ret, "get_mem_info")
    assert 0 < free <= total, (free, total)

    n = 4096
    size = n * 4
    src = np.arange(n, dtype=np.float32) * 0.5
    dev, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "malloc")
    check(acl.rt.memcpy(dev, size, acl.util.numpy_to_ptr(src), size, ACL_MEMCPY_HOST_TO_DEVICE), "memcpy H2D")
    free_after, _, _ = acl.rt.get_mem_info(ACL_HBM_MEM)
    assert free_after < free, (free_after, free)

    # device -> an immutable bytes object, read with np.frombuffer (the samples' idiom)
    out = bytes(size)
    check(acl.rt.memcpy(acl.util.bytes_to_ptr(out), size, dev, size, ACL_MEMCPY_DEVICE_TO_HOST), "memcpy D2H")
    np.testing.assert_array_equal(np.frombuffer(out, dtype=np.float32), src)

    # pinned host memory, device-to-device, a wrong kind (warns once, still copies by the addresses)
    host, ret = acl.rt.malloc_host(size)
    check(ret, "malloc_host")
    dev2, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_NORMAL_ONLY)
    check(ret, "malloc")
    check(acl.rt.memcpy(dev2, size, dev, size, ACL_MEMCPY_DEVICE_TO_DEVICE), "memcpy D2D")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check(acl.rt.memcpy(host, size, dev2, size, ACL_MEMCPY_HOST_TO_DEVICE), "memcpy with the wrong kind")
    assert any("does not match the addresses" in str(w.message) for w in caught), [str(w.message) for w in caught]
    np.testing.assert_array_equal(acl.util.ptr_to_numpy(host, (n,), NPY_FLOAT32), src)
    assert acl.util.ptr_to_bytes(host, 8) == src[:2].tobytes()

    # host memset, sync and stream-ordered; device memset read back through a numpy array
    check(acl.rt.memset(host, size, 0, size), "memset host")
    assert acl.util.ptr_to_bytes(host, size) == bytes(size)
    stream_a, ret = acl.rt.create_stream()
    check(ret, "create_stream")
    stream_b, ret = acl.rt.create_stream()
    check(ret, "create_stream")
    check(acl.rt.memset_async(host, size, 0x5A, 100, stream_a), "memset_async host")
    check(acl.rt.synchronize_stream(stream_a), "synchronize_stream")
    assert acl.util.ptr_to_bytes(host, 101) == b"\x5a" * 100 + b"\0"
    check(acl.rt.memset(dev2, size, 0xFF, 8), "memset device")
    back = np.zeros(n, np.int32)
    check(acl.rt.memcpy(acl.util.numpy_to_ptr(back), size, dev2, size, ACL_MEMCPY_DEVICE_TO_HOST), "memcpy")
    assert back[0] == -1 and back[1] == -1 and back[2] == np.float32(1.0).view(np.int32), back[:3]

    # two streams: A uploads, B waits for A's event and copies device-to-device, then downloads
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    y = np.empty_like(x)
    event, ret = acl.rt.create_event()
    check(ret, "create_event")
    check(acl.rt.memcpy_async(dev, size, acl.util.numpy_to_ptr(x), size, ACL_MEMCPY_HOST_TO_DEVICE, stream_a), "async")
    check(acl.rt.record_event(event, stream_a), "record_event")
    check(acl.rt.stream_wait_event(stream_b, event), "stream_wait_event")
    check(acl.rt.memcpy_async(dev2, size, dev, size, ACL_MEMCPY_DEVICE_TO_DEVICE, stream_b), "async D2D")
    check(acl.rt.memcpy_async(acl.util.numpy_to_ptr(y), size, dev2, size, ACL_MEMCPY_DEVICE_TO_HOST, stream_b),
          "async D2H")
    check(acl.rt.synchronize_stream(stream_b), "synchronize_stream")
    np.testing.assert_array_equal(y, x)
    status, ret = acl.rt.query_event_status(event)
    assert (status, ret) == (1, 0), (status, ret)
    check(acl.rt.synchronize_device(0), "synchronize_device with the device id programs pass")

    # what real pyACL would segfault on, or silently corrupt, returns a code and says why
    message = expect(acl.rt.memcpy(host, size + 4, dev, size + 4, ACL_MEMCPY_DEVICE_TO_HOST), 107000, "overrun")
    assert "past the end" in message, message
    expect(acl.rt.memcpy(0x1234, 4, dev, 4, ACL_MEMCPY_DEVICE_TO_HOST), 107000, "unknown host address")
    expect(acl.rt.memcpy(dev, size, dev2, size + 8, ACL_MEMCPY_DEVICE_TO_DEVICE), 107000, "count over dest_max")  # rtMemcpy checks
    expect(acl.rt.free_host(host + 16), 107000, "free_host inside a buffer")
    check(acl.rt.free_host(host), "free_host")
    message = expect(acl.rt.free_host(host), 207002, "double free_host")
    assert "double free" in message, message
    message = expect(acl.rt.memcpy(host, size, dev, size, ACL_MEMCPY_DEVICE_TO_HOST), 107000, "use after free_host")
    assert "use after free" in message, message
    ptr, ret = acl.rt.malloc(1 << 50, ACL_MEM_MALLOC_HUGE_FIRST)
    assert ptr == 0
    expect(ret, 207001, "out of device memory")
    _, ret = acl.rt.malloc_host(1 << 50)
    expect(ret, 207001, "out of host memory")
    check(acl.rt.free(dev2), "free")
    expect(acl.rt.free(dev2), 207002, "double free")
    expect(acl.rt.memset(dev2, size, 0, size), 107000, "memset of freed device memory")

    check(acl.rt.free(dev), "free")
    check(acl.rt.destroy_event(event), "destroy_event")
    check(acl.rt.destroy_stream(stream_a), "destroy_stream")
    check(acl.rt.destroy_stream(stream_b), "destroy_stream")
    expect(acl.rt.destroy_stream(stream_b), 100000, "destroy a stream twice")
    check(acl.rt.destroy_context(context), "destroy_context")
    check(acl.rt.reset_device(0), "reset_device")
    expect(acl.init(), 100002, "repeated init")
    check(acl.finalize(), "finalize")
    print("OK")


if __name__ == "__main__":
    main()
