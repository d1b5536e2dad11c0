"""hccl.DataParallel: bucket assignment, gradient views, stream ordering, and the same averaged
gradients as a per-tensor all_reduce and as numpy (the oracle), for mixed shapes and dtypes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hccl.ddp import MIB, assign_buckets

BF16 = np.dtype(ml_dtypes.bfloat16)
F32, F16, F64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)


def _specs(*items):
    return [(tuple(shape), np.dtype(dt)) for shape, dt in items]


# ---------------------------------------------------------------- assignment (pure)

def test_buckets_fill_in_reverse_order_with_a_small_first_bucket():
    # 8 float32 params of 256 KiB each: the first bucket (launched first) closes at 1 MiB = the last
    # four params; the rest go to the next bucket, which closes at 25 MiB or at the end.
    specs = _specs(*[((64 * 1024,), F32)] * 8)
    assert assign_buckets(specs) == [[7, 6, 5, 4], [3, 2, 1, 0]]
    assert assign_buckets(specs, bucket_bytes=512 << 10, first_bucket_bytes=256 << 10) == \
        [[7], [6, 5], [4, 3], [2, 1], [0]]


def test_buckets_are_per_dtype_and_a_large_param_gets_its_own():
    specs = _specs(((4,), F32), ((3, 3), F16), ((2 * MIB,), F32), ((5,), F16), ((7,), F32))
    buckets = assign_buckets(specs)
    assert buckets == [[4, 2], [3, 1], [0]]          # 7 + 2 Mi floats passes 1 MiB: closes
    for bucket in buckets:
        assert len({specs[i][1] for i in bucket}) == 1
    assert sorted(i for b in buckets for i in b) == list(range(len(specs)))


# ---------------------------------------------------------------- on cards

MIXED = [((3, 5), F32), ((), F32), ((17,), F16), ((4, 4), BF16), ((6,), F64), ((70_000,), F32), ((2, 3, 4), F16)]


def _rank_grads(rank: int) -> list[np.ndarray]:
    rng = np.random.default_rng(100 + rank)
    return [(rng.standard_normal(shape) * 4).astype(dt) for shape, dt in MIXED]


def _oracle(world: int) -> list[np.ndarray]:
    per_rank = [_rank_grads(r) for r in range(world)]
    return [(sum(g[i].astype(np.float64) for g in per_rank) / world) for i in range(len(MIXED))]


def _upload(t, a):
    # flat views: Tensor.copy_from turns a 0-d array into shape (1,) (np.ascontiguousarray)
    t.view((t.size,)).copy_from(np.asarray(a).reshape(-1))


def _tol(dt):
    return {F16: 2e-2, BF16: 5e-2}.get(dt, 1e-6)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_bucketed_equals_per_tensor_and_numpy(rt_local, world):
    import hccl
    import rt
    from hccl.ddp import DataParallel, all_reduce_gradients
    comms = hccl.comm_init_all(list(range(world)))
    dps, plain = [], []
    for c in comms:
        rt.set_context(c.ctx)
        dp = DataParallel(c, MIXED, bucket_bytes=64 << 10, first_bucket_bytes=1024)
        assert len(dp.buckets) >= 3
        for i, g in enumerate(_rank_grads(c.rank)):
            _upload(dp.grad(i), g)
        for i in reversed(range(len(MIXED))):       # backward order
            dp.mark_ready(i)
        dp.finish()
        tensors = [rt.Tensor.from_numpy(g) if g.ndim else rt.Tensor.from_numpy(g.reshape(1)).view(())
                   for g in _rank_grads(c.rank)]
        all_reduce_gradients(tensors, c)
        dps.append(dp)
        plain.append(tensors)
    oracle = _oracle(world)
    for r in range(world):
        for i, (shape, dt) in enumerate(MIXED):
            got = dps[r].grad(i).numpy()
            ref = plain[r][i].numpy()
            assert got.shape == shape and got.dtype == dt
            np.testing.assert_allclose(got.astype(np.float64), oracle[i], rtol=_tol(dt), atol=_tol(dt),
                                       err_msg=f"rank {r} grad {i}")
            np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=_tol(dt), atol=_tol(dt))
            if world == 2:    # a + b == b + a: any schedule gives the same bits for two ranks
                assert got.tobytes() == ref.tobytes(), f"grad {i} not bit-equal"
    for dp in dps:
        dp.close()


def test_gradients_are_views_into_the_bucket_buffer(rt_local):
    import hccl
    from hccl.ddp import DataParallel
    (comm,) = hccl.comm_init_all([0])
    rt_local.set_context(comm.ctx)
    dp = DataParallel(comm, [((4, 4), F32), ((8,), F32), ((3,), F16)])
    for bucket in dp.buckets:
        end = bucket.buffer.ptr + bucket.buffer.nbytes
        for i in bucket.members:
            g = dp.grad(i)
            assert bucket.buffer.ptr <= g.ptr and g.ptr + g.nbytes <= end
            assert g.ptr == bucket.buffer.ptr + bucket.offsets[i]
    # world size 1: the average is the gradient itself
    dp.grad(0).copy_from(np.full((4, 4), 3.0, np.float32))
    dp.finish()
    assert np.array_equal(dp.grad(0).numpy(), np.full((4, 4), 3.0, np.float32))
    dp.close()


def test_comm_stream_waits_for_the_gradient_kernel_and_compute_waits_for_the_reduce(rt_local):
    """The gradient is written by a kernel queued behind a 0.3 s sleep on the compute stream; the
    all-reduce must see it (event), and a kernel queued after finish() must see the average."""
    import hccl
    import rt
    from hccl.ddp import DataParallel
    comms = hccl.comm_init_all([0, 1])
    outs, dps = [], []
    for c in comms:
        rt.set_context(c.ctx)
        dp = DataParallel(c, [((1000,), F32)])
        src = rt.Tensor.from_numpy(np.full(1000, c.rank + 1.0, np.float32))
        rt.sleep_kernel(0.3)                                 # a slow backward on the default stream
        rt.ops.identity(src, out=[dp.grad(0)])
        dp.mark_ready(0)
        dp.finish()
        outs.append(rt.ops.relu(dp.grad(0)))                 # compute stream, after finish()
        dps.append(dp)
    for out in outs:
        assert np.array_equal(out.numpy(), np.full(1000, 1.5, np.float32))
    for dp in dps:
        dp.close()


def test_buckets_launch_in_bucket_order_only(rt_local):
    import hccl
    from hccl.ddp import DataParallel
    (comm,) = hccl.comm_init_all([0])
    dp = DataParallel(comm, [((300,), F32)] * 4, bucket_bytes=1200, first_bucket_bytes=1200)
    assert [b.members for b in dp.buckets] == [[3], [2], [1], [0]]
    dp.mark_ready(1)          # bucket 2 complete, but buckets 0 and 1 are not: nothing launches
    assert not any(b.launched for b in dp.buckets)
    dp.mark_ready(3)
    assert [b.launched for b in dp.buckets] == [True, False, False, False]
    dp.mark_ready(2)          # now buckets 1 and 2 go, in order
    assert [b.launched for b in dp.buckets] == [True, True, True, False]
    dp.finish()
    assert not any(b.launched for b in dp.buckets)          # reset for the next step
    dp.close()


def test_bad_use_is_reported(rt_local):
    import hccl
    from hccl.ddp import DataParallel, all_reduce_gradients
    (comm,) = hccl.comm_init_all([0])
    with pytest.raises(hccl.HcclError, match="integer dtype int32") as e:
        DataParallel(comm, [((3,), np.int32)])
    assert e.value.code == hccl.HCCL_E_PARA
    with pytest.raises(hccl.HcclError, match="bucket_bytes=0"):
        DataParallel(comm, [((3,), F32)], bucket_bytes=0)
    with pytest.raises(hccl.HcclError, match="complex64"):
        DataParallel(comm, [((3,), np.complex64)], average=False)
    dp = DataParallel(comm, [((3,), np.int32), ((2,), F32)], average=False)
    dp.mark_ready(0)
    with pytest.raises(hccl.HcclError, match="already marked ready"):
        dp.mark_ready(0)
    with pytest.raises(hccl.HcclError, match="not one of the registered parameters"):
        dp.grad(object())
    with pytest.raises(hccl.HcclError, match="outside"):
        dp.grad(5)
    dp.finish()
    with pytest.raises(hccl.HcclError, match="expected rt.Tensor"):
        all_reduce_gradients([np.zeros(3)], comm)
    dp.close()
