"""Every collective on in-process cards against a numpy oracle: dtypes, reduce ops, world sizes,
roots, counts (0, 1, 7, 1000, not divisible by the rank count), in-place calls, uneven all_to_all_v,
point-to-point, barrier, algorithms forced by HCCL_ALGO, and HCCL_DETERMINISTIC reproducibility.

Integer data (and floats holding small integers) make results exact; random floats are compared
with a tolerance. The oracle never looks at the schedules: it is plain numpy over the inputs.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import hccl
import rt

DTYPES = {"int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64, "uint8": np.uint8,
          "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64, "fp16": np.float16,
          "fp32": np.float32, "fp64": np.float64, "bf16": rt.BFLOAT16}
OPS = ["sum", "prod", "max", "min"]
UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
SIZES = [1, 2, 3, 5, 8]
COUNTS = [0, 1, 7, 1000]
ALL = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "scatter", "all_to_all",
       "all_to_all_v", "send_recv", "barrier"]
REDUCING = {"all_reduce", "reduce", "reduce_scatter"}
ROOTED = {"broadcast", "reduce", "scatter"}


# ------------------------------------------------------------------------------------------ data
def make_data(n: int, length: int, dtype, op: str = "sum", seed: int = 0) -> list[np.ndarray]:
    """Per-rank inputs whose reduction is exact in ``dtype`` (integers wrap identically in numpy)."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(seed + 1000 * n + length)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return [rng.integers(info.min, info.max, length, dtype=dt, endpoint=True) for _ in range(n)]
    if op == "prod":            # |product| <= 2**8: exact even in bf16
        vals = np.array([-2, -1, 1, 2], dtype=np.float64)
        return [rng.choice(vals, length).astype(dt) for _ in range(n)]
    return [rng.integers(-8, 9, length).astype(dt) for _ in range(n)]   # sums of 8 stay exact


def reduce_np(op: str, arrays, dtype) -> np.ndarray:
    dt = np.dtype(dtype)
    return functools.reduce(lambda a, b: UFUNC[op](a, b).astype(dt), [a.astype(dt) for a in arrays])


def sentinel(count, dtype) -> np.ndarray:
    dt = np.dtype(dtype)
    return np.full(count, 0x5A if dt.kind in "iu" else 7.0, dtype=dt)


def v_tables(n: int, seed: int):
    """Uneven all_to_all_v tables with gaps: counts[i][j] = what rank i sends to rank j."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 6, (n, n))
    counts[0, :] = 0 if n > 1 else counts[0, :]          # a rank that sends nothing
    sdispls = [[int(x) for x in np.concatenate([[0], np.cumsum(counts[i] + 1)[:-1]])] for i in range(n)]
    rdispls = [[int(x) for x in np.concatenate([[0], np.cumsum(counts[:, i] + 2)[:-1]])] for i in range(n)]
    send_len = [max([d + c for d, c in zip(sdispls[i], counts[i])] + [1]) for i in range(n)]
    recv_len = [max([d + c for d, c in zip(rdispls[i], counts[:, i])] + [1]) for i in range(n)]
    return counts.tolist(), sdispls, rdispls, send_len, recv_len


# ------------------------------------------------------------------------------------------ runner
def run(C, comms, name: str, count: int, dtype, op: str = "sum", root: int = 0, seed: int = 0,
        in_place: bool = False):
    """Run collective ``name`` on every rank of ``comms``; return (outputs, expected) per rank."""
    n = len(comms)
    dt = np.dtype(dtype)
    code = hccl.types.hccl_dtype(dt)
    big = {"reduce_scatter": count * n, "scatter": count * n, "all_to_all": count * n}.get(name, count)
    data = make_data(n, big, dt, op, seed)
    if name == "all_to_all_v":
        counts, sd, rd, send_len, recv_len = v_tables(n, seed)
        data = make_data(n, max(send_len), dt, op, seed)
    sends = [C.upload(c, d) for c, d in zip(comms, data)]
    out_len = {"all_gather": count * n, "all_to_all": count * n}.get(name, count)
    if name == "all_to_all_v":
        recvs = [C.filled(c, recv_len[r], dt) for r, c in enumerate(comms)]
    else:
        recvs = [sends[r] if in_place else C.filled(c, out_len, dt) for r, c in enumerate(comms)]
    for r, c in enumerate(comms):
        s, d = sends[r].ptr, recvs[r].ptr
        if name == "all_reduce":
            hccl.all_reduce(s, d, count, code, op, c)
        elif name == "broadcast":
            hccl.broadcast(s, count, code, root, c)
        elif name == "reduce":
            hccl.reduce(s, d, count, code, op, root, c)
        elif name == "all_gather":
            hccl.all_gather(s, d, count, code, c)
        elif name == "reduce_scatter":
            hccl.reduce_scatter(s, d, count, code, op, c)
        elif name == "scatter":
            hccl.scatter(s, d, count, code, root, c)
        elif name == "all_to_all":
            hccl.all_to_all(s, count, code, d, count, code, c)
        elif name == "all_to_all_v":
            hccl.all_to_all_v(s, counts[r], sd[r], code, d, [counts[j][r] for j in range(n)], rd[r], code, c)
        elif name == "send_recv":              # a ring shift: everyone sends right, receives from the left
            if n > 1:
                hccl.batch_send_recv([(hccl.HCCL_SEND, s, count, code, (r + 1) % n),
                                      (hccl.HCCL_RECV, d, count, code, (r - 1) % n)] if count else [], c)
        elif name == "barrier":
            hccl.barrier(c)
        else:
            raise AssertionError(name)
    C.sync(comms)
    outs = [(sends if name == "broadcast" else recvs)[r].numpy() for r in range(n)]
    outs = [o[:out_len] if name != "all_to_all_v" else o for o in outs]
    C.free(sends, [] if in_place else recvs)

    # the oracle
    if name == "all_reduce":
        want = [reduce_np(op, data, dt)] * n
    elif name == "broadcast":
        want = [data[root]] * n
    elif name == "reduce":
        want = [reduce_np(op, data, dt) if r == root else (data[r] if in_place else sentinel(count, dt))
                for r in range(n)]
    elif name == "all_gather":
        want = [np.concatenate(data)] * n
    elif name == "reduce_scatter":
        full = reduce_np(op, data, dt)
        want = [full[r * count:(r + 1) * count] for r in range(n)]
    elif name == "scatter":
        want = [data[root][r * count:(r + 1) * count] for r in range(n)]
    elif name == "all_to_all":
        want = [np.concatenate([data[j][r * count:(r + 1) * count] for j in range(n)]) for r in range(n)]
    elif name == "all_to_all_v":
        want = []
        for r in range(n):
            w = sentinel(recv_len[r], dt)
            for j in range(n):
                c_ = counts[j][r]
                w[rd[r][j]: rd[r][j] + c_] = data[j][sd[j][r]: sd[j][r] + c_]
            want.append(w)
    elif name == "send_recv":
        want = [data[(r - 1) % n] if n > 1 else sentinel(count, dt) for r in range(n)]
    elif name == "barrier":
        want = [sentinel(count, dt)] * n
    return outs, want


def check(outs, want, exact=True):
    for r, (o, w) in enumerate(zip(outs, want)):
        assert o.dtype == w.dtype and o.shape == w.shape, f"rank {r}: {o.dtype}{o.shape} vs {w.dtype}{w.shape}"
        if exact:
            assert np.array_equal(o.view(np.uint8), w.view(np.uint8)), f"rank {r}: got {o[:16]}, expected {w[:16]}"
        else:
            np.testing.assert_allclose(o.astype(np.float64), w.astype(np.float64), rtol=2e-2, atol=1e-2,
                                       err_msg=f"rank {r}")


# ------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", OPS)
def test_reductions_every_dtype_and_op(comms, dtype, op):
    """all_reduce (8 ranks), reduce and reduce_scatter (5 ranks) for every dtype × reduce op."""
    dt = DTYPES[dtype]
    check(*run(comms, comms.world(8), "all_reduce", 1000, dt, op))
    check(*run(comms, comms.world(5), "reduce", 7, dt, op, root=3))
    check(*run(comms, comms.world(5), "reduce_scatter", 7, dt, op))


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_data_movement_every_dtype(comms, dtype):
    dt = DTYPES[dtype]
    for name in ("broadcast", "all_gather", "scatter", "all_to_all", "all_to_all_v", "send_recv"):
        check(*run(comms, comms.world(3), name, 7, dt, root=2, seed=3))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", ALL)
def test_world_sizes_and_counts(comms, name, n):
    for count in COUNTS:
        if name == "all_to_all_v" and count:
            continue                          # its counts come from the v tables (one run below)
        check(*run(comms, comms.world(n), name, count, np.int32, root=n - 1, seed=count))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", sorted(ROOTED))
def test_every_root(comms, name, n):
    for root in range(n):
        check(*run(comms, comms.world(n), name, 13, np.int16, "max", root=root, seed=root))


@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize("op", OPS)
def test_in_place(comms, n, op):
    """send == recv for all_reduce and reduce (HCCL allows both in place)."""
    check(*run(comms, comms.world(n), "all_reduce", 1001, np.int64, op, in_place=True))
    check(*run(comms, comms.world(n), "reduce", 1001, np.int64, op, root=n // 2, in_place=True))


def test_random_floats_with_tolerance(comms):
    """Arbitrary float data: every algorithm's reduction order is within rounding of numpy's."""
    n = 8
    rng = np.random.default_rng(7)
    for dt, rtol in ((np.float32, 1e-5), (np.float16, 1e-2), (rt.BFLOAT16, 5e-2)):
        data = [rng.standard_normal(777).astype(dt) for _ in range(n)]
        ts = [comms.upload(c, d) for c, d in zip(comms.world(n), data)]
        for c, t in zip(comms.world(n), ts):
            c.all_reduce(t)
        want = np.sum([d.astype(np.float64) for d in data], axis=0)
        for t in ts:
            np.testing.assert_allclose(t.numpy().astype(np.float64), want, rtol=rtol, atol=rtol * 8)
        comms.free(ts)


def test_uneven_all_to_all_v(comms):
    for n in (2, 5, 8):
        for seed in range(3):
            check(*run(comms, comms.world(n), "all_to_all_v", 0, np.float32, seed=seed))


def test_send_recv_pairs(comms):
    """Disjoint pairs 0→1, 2→3 ... with plain send/recv, twice in a row on each pair (order kept)."""
    cs = comms.world(8)
    data = [np.arange(100, dtype=np.int32) * (r + 1) for r in range(8)]
    src = [comms.upload(c, d) for c, d in zip(cs, data)]
    dst = [comms.filled(c, 100, np.int32) for c in cs]
    dst2 = [comms.filled(c, 50, np.int32) for c in cs]
    for r, c in enumerate(cs):
        if r % 2 == 0:
            hccl.send(src[r].ptr, 100, "int32", r + 1, c)
            hccl.send(src[r].ptr + 200, 50, "int32", r + 1, c)
        else:
            hccl.recv(dst[r].ptr, 100, "int32", r - 1, c)
            hccl.recv(dst2[r].ptr, 50, "int32", r - 1, c)
    comms.sync(cs)
    for r in range(1, 8, 2):
        assert np.array_equal(dst[r].numpy(), data[r - 1])
        assert np.array_equal(dst2[r].numpy(), data[r - 1][50:])
    for r in range(0, 8, 2):
        assert np.array_equal(dst[r].numpy(), sentinel(100, np.int32))
    comms.free(src, dst, dst2)


def test_batch_send_recv_all_pairs(comms):
    """Every rank exchanges with every other rank in one batch (dict items), fp64."""
    cs = comms.world(5)
    n = len(cs)
    data = [np.arange(n * 4, dtype=np.float64) + 100 * r for r in range(n)]
    src = [comms.upload(c, d) for c, d in zip(cs, data)]
    dst = [comms.filled(c, n * 4, np.float64) for c in cs]
    for r, c in enumerate(cs):
        items = []
        for p in range(n):
            if p != r:
                items.append({"type": hccl.HCCL_RECV, "buf": dst[r].ptr + 32 * p, "count": 4,
                              "dtype": hccl.HCCL_DATA_TYPE_FP64, "remote_rank": p})
                items.append({"type": hccl.HCCL_SEND, "buf": src[r].ptr + 32 * p, "count": 4,
                              "dtype": hccl.HCCL_DATA_TYPE_FP64, "remote_rank": p})
        hccl.batch_send_recv(items, c)
    comms.sync(cs)
    for r in range(n):
        got = dst[r].numpy().reshape(n, 4)
        for p in range(n):
            want = sentinel(4, np.float64) if p == r else data[p][4 * r: 4 * r + 4]
            assert np.array_equal(got[p], want), (r, p)
    comms.free(src, dst)


def test_barrier_orders_work_across_ranks(comms):
    """Work queued before rank 0's barrier is done before any rank passes its barrier."""
    cs = comms.world(3)
    seen = []
    flag = []

    def slow(_):
        import time
        time.sleep(0.2)
        flag.append("rank0 before barrier")

    for r, c in enumerate(cs):
        rt.set_context(c.ctx)
        if r == 0:
            rt.launch_callback(slow)
        hccl.barrier(c)
        rt.launch_callback(lambda _, r=r: seen.append((r, list(flag))))
    comms.sync(cs)
    assert sorted(r for r, _ in seen) == [0, 1, 2]
    assert all(f == ["rank0 before barrier"] for _, f in seen), seen


def test_tensor_helpers(comms):
    cs = comms.world(3)
    n = len(cs)
    data = [np.arange(12, dtype=np.float32).reshape(6, 2) + 10 * r for r in range(n)]
    ts = [comms.upload(c, d) for c, d in zip(cs, data)]
    gathered = [c.all_gather(t) for c, t in zip(cs, ts)]
    scattered = [c.reduce_scatter(t, op="max") for c, t in zip(cs, ts)]
    swapped = [c.all_to_all(t) for c, t in zip(cs, ts)]
    for c, t in zip(cs, ts):
        c.all_reduce(t, op="sum")
    total = np.sum(data, axis=0)
    for r in range(n):
        assert gathered[r].shape == (n, 6, 2) and np.array_equal(gathered[r].numpy(), np.stack(data))
        assert np.array_equal(scattered[r].numpy(), np.max(data, axis=0)[2 * r: 2 * r + 2])
        assert np.array_equal(swapped[r].numpy(), np.concatenate([d[2 * r: 2 * r + 2] for d in data]))
        assert np.array_equal(ts[r].numpy(), total)
    rt.set_context(cs[0].ctx)
    ts[0].copy_from(np.zeros((6, 2), np.float32))
    for c, t in zip(cs, ts):
        c.broadcast(t, root=1)
    for r in range(n):
        assert np.array_equal(ts[r].numpy(), total)
    rt.set_context(cs[0].ctx)
    ts[0].copy_from(data[0])
    cs[0].send(ts[0], 2)                      # blocking send semantics: pairs, not a ring
    assert cs[2].recv(ts[2], 0) is ts[2]
    comms.sync(cs)
    assert np.array_equal(ts[2].numpy(), data[0])
    with pytest.raises(hccl.HcclError) as e:
        cs[0].reduce_scatter(comms.upload(cs[0], np.zeros(4, np.float32)))
    assert e.value.code == hccl.HCCL_E_PARA
    comms.free(ts, gathered, scattered, swapped)


ALGOS = {"ring": "level0:ring", "H-D_R": "level0:NA;level1:H-D_R", "fullmesh": "level0:fullmesh",
         "per-op": "allreduce=level0:ring/allgather=level0:ring/other=level0:NA;level1:ring"}


@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("n", [3, 8])
def test_hccl_algo_matches_mesh(comms, algo, n):
    """HCCL_ALGO (read at comm init) changes the schedule, never the result."""
    forced = comms.world(n, HCCL_ALGO=ALGOS[algo])
    assert all(c.options["algo"] == ALGOS[algo] for c in forced)      # read at init, kept by the comm
    for name in ALL:
        for count in (7, 1000):
            got = run(comms, forced, name, count, np.uint32, "sum", root=n - 1, seed=count)
            ref = run(comms, comms.world(n), name, count, np.uint32, "sum", root=n - 1, seed=count)
            check(*got)
            check(got[0], ref[0])
    # a large message (more than 1 MiB: where configs with a ring threshold switch algorithm)
    check(*run(comms, forced, "all_reduce", 300_000, np.float32, "sum"))


@pytest.mark.parametrize("algo", [None, "level0:ring"])
def test_deterministic_runs_are_bit_identical(comms, algo):
    """HCCL_DETERMINISTIC=true: the same inputs give the same bits, run after run and on every rank."""
    cs = comms.over(range(8), HCCL_DETERMINISTIC="true", HCCL_ALGO=algo)
    rng = np.random.default_rng(11)
    data = [rng.standard_normal(300_000).astype(np.float32) for _ in range(8)]
    small = [d[:999] for d in data]
    results = []
    for _ in range(2):
        for arrays in (data, small):
            ts = [comms.upload(c, d) for c, d in zip(cs, arrays)]
            for c, t in zip(cs, ts):
                c.all_reduce(t)
            outs = [t.numpy() for t in ts]
            comms.free(ts)
            for r in range(1, 8):                 # every rank holds the same bits
                assert np.array_equal(outs[r].view(np.uint32), outs[0].view(np.uint32)), r
            results.append(outs[0])
    assert np.array_equal(results[0].view(np.uint32), results[2].view(np.uint32))
    assert np.array_equal(results[1].view(np.uint32), results[3].view(np.uint32))


def test_collectives_queue_on_a_user_stream(comms):
    """Collectives are ordered with other work on the stream they are given."""
    cs = comms.world(2)
    streams, ts = [], []
    for c in cs:
        rt.set_context(c.ctx)
        streams.append(rt.create_stream())
        ts.append(rt.Tensor.from_numpy(np.zeros(64, np.int32)))
    for r, (c, s, t) in enumerate(zip(cs, streams, ts)):
        rt.set_context(c.ctx)
        rt.memset_async(t.ptr, t.nbytes, r + 1, t.nbytes, s)      # every byte = r + 1
        hccl.all_reduce(t.ptr, t.ptr, 64, "int32", "sum", c, s)
    for c, s in zip(cs, streams):
        c.synchronize(s)
    want = np.full(64, 0x01010101 + 0x02020202, np.int32)
    for c, s, t in zip(cs, streams, ts):
        assert np.array_equal(t.numpy(), want)
        rt.set_context(c.ctx)
        rt.destroy_stream(s)
    comms.free(ts)
