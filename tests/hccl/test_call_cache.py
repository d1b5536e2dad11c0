"""A call signature's arguments are checked once per communicator (hccl/api.py): what a later call with the
same arguments skips must never let through what the first check would have refused — on in-process cards."""

from __future__ import annotations

import numpy as np
import pytest

import hccl

E_PARA, E_PTR = int(hccl.HcclResult.HCCL_E_PARA), int(hccl.HcclResult.HCCL_E_PTR)
FP32, SUM = hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM


def _all_reduce_twice(comms, cs, count=16, stream=None):
    sends = [comms.upload(c, np.full(count, r + 1, np.float32)) for r, c in enumerate(cs)]
    recvs = [comms.filled(c, count, np.float32) for c in cs]
    for _ in range(2):
        for c, s, r in zip(cs, sends, recvs):
            hccl.all_reduce(s.ptr, r.ptr, count, FP32, SUM, c, stream)
        comms.sync(cs)
    want = np.full(count, sum(range(1, len(cs) + 1)), np.float32)
    assert all(np.array_equal(r.numpy(), want) for r in recvs)
    return sends, recvs


@pytest.mark.parametrize("bad, code, text", [
    ({"count": 16.0}, E_PARA, "count must be an int"),
    ({"count": True}, E_PARA, "count must be an int"),
    ({"dtype": 3.0}, E_PARA, "unknown dtype"),
    ({"op": 0.0}, E_PARA, "unknown HcclReduceOp"),
    ({"op": False}, E_PARA, "unknown HcclReduceOp"),
    ({"send": "float"}, E_PTR, "is not a device address"),
    ({"send": [1]}, E_PTR, "is not a device address"),
])
def test_a_remembered_call_still_refuses_arguments_equal_to_it_but_of_another_type(comms, bad, code, text):
    cs = comms.world(2)
    sends, recvs = _all_reduce_twice(comms, cs)
    call = {"send": sends[0].ptr, "recv": recvs[0].ptr, "count": 16, "dtype": FP32, "op": SUM}
    if bad.get("send") == "float":
        bad = {"send": float(sends[0].ptr)}
    call.update(bad)
    with pytest.raises(hccl.HcclError) as e:
        hccl.all_reduce(call["send"], call["recv"], call["count"], call["dtype"], call["op"], cs[0])
    assert int(e.value.code) == code and text in str(e.value)
    comms.free(sends, recvs)


def test_a_remembered_call_on_a_destroyed_stream_or_communicator_is_refused(comms):
    import rt
    cs = comms.fresh([0, 1])
    streams = []
    for c in cs:
        rt.set_context(c.ctx)
        streams.append(rt.create_stream())
    sends = [comms.upload(c, np.full(8, r + 1, np.float32)) for r, c in enumerate(cs)]
    recvs = [comms.filled(c, 8, np.float32) for c in cs]
    for _ in range(2):
        for c, s, r, st in zip(cs, sends, recvs, streams):
            hccl.all_reduce(s.ptr, r.ptr, 8, FP32, SUM, c, st)
        for st in streams:
            rt.synchronize_stream(st)
    assert np.array_equal(recvs[1].numpy(), np.full(8, 3, np.float32))
    rt.set_context(cs[0].ctx)
    rt.destroy_stream(streams[0])
    with pytest.raises(hccl.HcclError) as e:
        hccl.all_reduce(sends[0].ptr, recvs[0].ptr, 8, FP32, SUM, cs[0], streams[0])
    assert int(e.value.code) == E_PARA and "destroyed" in str(e.value)
    for c in cs:
        hccl.comm_destroy(c)
    with pytest.raises(hccl.HcclError) as e:
        hccl.all_reduce(sends[1].ptr, recvs[1].ptr, 8, FP32, SUM, cs[1], streams[1])
    assert int(e.value.code) == E_PARA and "was destroyed" in str(e.value)
    comms.free(sends, recvs)


def test_remembered_calls_see_new_data_and_are_bounded(comms):
    from hccl import api
    cs = comms.world(2)
    count = api.MAX_CALLS + 10
    sends, recvs = _all_reduce_twice(comms, cs, count=count)
    for step in range(3):                       # same signature, new contents every time
        for r, s in enumerate(sends):
            _write(cs[r], s, np.full(count, 10 * step + r, np.float32))
        for c, s, r in zip(cs, sends, recvs):
            hccl.all_reduce(s.ptr, r.ptr, count, FP32, SUM, c)
        comms.sync(cs)
        assert all(np.array_equal(r.numpy(), np.full(count, 20 * step + 1, np.float32)) for r in recvs)
    for k in range(count):                      # many signatures (one element each): remembered, bounded
        for c, s, r in zip(cs, sends, recvs):
            hccl.all_reduce(s.ptr + 4 * k, r.ptr + 4 * k, 1, FP32, hccl.HCCL_REDUCE_MAX, c)
    comms.sync(cs)
    assert all(np.array_equal(r.numpy(), np.full(count, 21, np.float32)) for r in recvs)
    assert all(0 < len(c.calls) <= api.MAX_CALLS for c in cs)
    comms.free(sends, recvs)


def _write(comm, tensor, array):
    import rt
    rt.set_context(comm.ctx)
    rt.memcpy(tensor.ptr, array.nbytes, array, array.nbytes, rt.ACL_MEMCPY_HOST_TO_DEVICE)


def test_rooted_calls_and_barriers_are_remembered_with_their_checks(comms):
    cs = comms.world(2)
    sends = [comms.upload(c, np.full(8, r + 1, np.float32)) for r, c in enumerate(cs)]
    recvs = [comms.filled(c, 8, np.float32) for c in cs]
    for _ in range(2):
        for c, s, r in zip(cs, sends, recvs):
            hccl.reduce(s.ptr, r.ptr, 8, FP32, SUM, 1, c)
            hccl.scatter(s.ptr, r.ptr, 4, FP32, 0, c)
            hccl.barrier(c)
        comms.sync(cs)
    assert np.array_equal(recvs[0].numpy()[:4], np.full(4, 1, np.float32))       # rank 0's block of its own send
    assert np.array_equal(recvs[1].numpy()[:4], np.full(4, 1, np.float32))       # rank 1's block of rank 0's send
    assert np.array_equal(recvs[1].numpy()[4:], np.full(4, 3, np.float32))       # the reduce, scatter left it
    for call in (lambda: hccl.reduce(sends[0].ptr, recvs[0].ptr, 8, FP32, SUM, 1.0, cs[0]),
                 lambda: hccl.scatter(sends[0].ptr, recvs[0].ptr, 4, FP32, True, cs[0]),
                 lambda: hccl.reduce(sends[0].ptr, recvs[0].ptr, 8, FP32, SUM, 2, cs[0])):
        with pytest.raises(hccl.HcclError) as e:
            call()
        assert int(e.value.code) == E_PARA and "root" in str(e.value)
    with pytest.raises(hccl.HcclError) as e:
        hccl.barrier(cs[0], "stream")
    assert int(e.value.code) == E_PARA
    comms.free(sends, recvs)
