"""Collective schedules: validity, race-freedom, numpy-oracle results and communication patterns."""

import numpy as np
import pytest

from hccl import types
from hccl.algos import hd, hierarchical, mesh, ring
from hccl.algos.schedule import Schedule, Transfer, buffer_sizes, make_schedule, run_numpy, validate
from hccl.errors import HcclError

WORLD_SIZES = [1, 2, 3, 5, 8, 16]
FLAT = {"mesh": mesh, "ring": ring, "hd": hd}
REDUCE_OPS = ["sum", "prod", "max", "min"]
UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
ROOTED = ("broadcast", "reduce", "scatter")
HIER = [(4, 2), (6, 2), (6, 3), (8, 4), (12, 4), (16, 4), (10, 5), (3, 3), (5, 1)]


def counts_for(n):
    # 0, 1, 7 and a count not divisible by n; fewer at 16 ranks to keep the suite fast
    return [0, 7, 3 * n + 1] if n == 16 else [0, 1, 7, 3 * n + 1]


def make_buffers(op, n, count, root, rng, dtype=np.int32):
    sizes = buffer_sizes(op, n, count, root=root)
    if np.dtype(dtype).kind == "f":
        sends = [rng.standard_normal(s["send"]).astype(dtype) for s in sizes]
    else:  # small values keep prod exact in int32 for 16 ranks (3**16 < 2**31)
        sends = [rng.integers(-3, 4, s["send"]).astype(dtype) for s in sizes]
    recvs = [np.full(s["recv"], 77, dtype) for s in sizes]
    if op == "broadcast":
        recvs[root][:] = rng.integers(-100, 100, count)
    return sizes, sends, recvs


def oracle(op, n, count, root, sends, recvs, red="sum"):
    """What every rank's recv must hold, computed directly with numpy."""
    dtype = recvs[0].dtype
    if op in ("all_reduce", "reduce", "reduce_scatter"):
        total = UFUNC[red].reduce(np.stack(sends), axis=0, dtype=dtype)
    if op == "all_reduce":
        return [total] * n
    if op == "reduce":
        return [total if r == root else np.empty(0, dtype) for r in range(n)]
    if op == "reduce_scatter":
        return [total[r * count:(r + 1) * count] for r in range(n)]
    if op == "all_gather":
        return [np.concatenate(sends)] * n
    if op == "scatter":
        return [sends[root][r * count:(r + 1) * count] for r in range(n)]
    if op == "broadcast":
        return [recvs[root].copy()] * n
    if op == "all_to_all":
        return [np.concatenate([sends[j][r * count:(r + 1) * count] for j in range(n)]) for r in range(n)]
    raise AssertionError(op)


def check(sched, op, n, count, root, rng, red="sum", dtype=np.int32):
    sizes, sends, recvs = make_buffers(op, n, count, root, rng, dtype)
    validate(sched, sizes)
    expected = oracle(op, n, count, root, sends, recvs, red)
    run_numpy(sched, sends, recvs, red)
    for r in range(n):
        if np.dtype(dtype).kind == "f":
            np.testing.assert_allclose(recvs[r], expected[r], rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(recvs[r], expected[r], err_msg=f"{sched.algo} {op} rank {r}")


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("algo", sorted(FLAT))
def test_reductions_every_op_and_count(algo, n):
    rng = np.random.default_rng(n)
    for count in counts_for(n):
        for red in REDUCE_OPS:
            check(FLAT[algo].all_reduce(n, count), "all_reduce", n, count, None, rng, red)
            check(FLAT[algo].reduce_scatter(n, count), "reduce_scatter", n, count, None, rng, red)
        check(FLAT[algo].all_reduce(n, count), "all_reduce", n, count, None, rng, "sum", np.float32)
        for root in range(n):
            red = REDUCE_OPS[root % 4]
            check(FLAT[algo].reduce(n, count, root=root), "reduce", n, count, root, rng, red)


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("algo", sorted(FLAT))
def test_data_movement_every_root(algo, n):
    rng = np.random.default_rng(100 + n)
    for count in counts_for(n):
        check(FLAT[algo].all_gather(n, count), "all_gather", n, count, None, rng)
        for root in range(n):
            check(FLAT[algo].broadcast(n, count, root=root), "broadcast", n, count, root, rng)
            check(FLAT[algo].scatter(n, count, root=root), "scatter", n, count, root, rng)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_push_schedules_every_root_and_count(n):
    """The pushing mesh broadcast and all_gather (a rank writes its peers' buffers): valid, race-free out of place
    and in place, every root, and equal to numpy; the broadcast is one step, the root's buffer read only."""
    rng = np.random.default_rng(200 + n)
    for count in counts_for(n) + [64 * n + 5]:
        ag = mesh.all_gather(n, count, push=True)
        check(ag, "all_gather", n, count, None, rng)
        validate(ag, buffer_sizes("all_gather", n, count), in_place=True)
        assert all(t.runner == t.src for step in ag.steps for t in step)
        for root in range(n):
            sched = mesh.broadcast(n, count, root=root, push=True)
            check(sched, "broadcast", n, count, root, rng)
            if count >= n * mesh.DIRECT_BROADCAST_MIN_CHUNK and n > 1:
                assert sched.num_steps == 1 and {t.runner for t in sched.steps[0]} == set(range(n))
                assert all(t.src == root and t.dst != root for t in sched.steps[0])


def test_for_call_pushes_inside_one_node_only():
    """Cards and the host path ask ``for_call``: on one node the mesh broadcast and all_gather push; across
    nodes (a fullmesh over every rank, where a peer's memory is not mapped) they pull."""
    from hccl.algos import select
    p = {"count": 1 << 20, "dtype": int(types.HcclDataType.FP32), "root": 3}
    for op in ("broadcast", "all_gather"):
        one = select.for_call(op, 8, p, 1, "fullmesh", 0)
        assert any(t.by >= 0 for step in one.steps for t in step), op
        two = select.for_call(op, 8, dict(p, algo="level0:NA;level1:fullmesh"), 2, "fullmesh", 0)
        assert all(t.by < 0 for step in two.steps for t in step), op
    assert all(t.by < 0 for step in select.for_call("all_reduce", 8, p, 1, "fullmesh", 0).steps for t in step)


def test_validate_detects_races_of_pushes():
    # ranks 0 and 1 both write rank 2's recv[0:2]
    both = make_schedule("test", "all_gather", 3, 2, None, [[
        Transfer(0, "send", 0, 2, "recv", 0, 2, False, by=0),
        Transfer(1, "send", 0, 2, "recv", 0, 2, False, by=1)]])
    with pytest.raises(HcclError, match=r"race in step 0: rank 0 writes rank 2 recv\[0:2\] while rank 1 writes "
                                        r"rank 2's recv\[0:2\]"):
        validate(both, {"send": 2, "recv": 6})
    # rank 2 reads its own recv while rank 0 pushes into it
    reads = make_schedule("test", "all_gather", 3, 2, None, [[
        Transfer(0, "send", 0, 2, "recv", 0, 2, False, by=0),
        Transfer(2, "recv", 0, 2, "recv", 4, 2, False)]])
    with pytest.raises(HcclError, match=r"rank 2 reads rank 2 recv\[0:2\] while rank 0 writes rank 2's recv"):
        validate(reads, {"send": 2, "recv": 6})
    with pytest.raises(HcclError, match="runner 3 out of"):
        validate(make_schedule("t", "all_gather", 3, 2, None, [[Transfer(0, "send", 0, 2, "recv", 0, 2, False, by=3)]]),
                 {"send": 2, "recv": 6})
    # one runner's own transfers run in order: no race
    validate(make_schedule("test", "all_gather", 3, 2, None, [[
        Transfer(0, "send", 0, 2, "recv", 0, 2, False, by=0),
        Transfer(2, "recv", 0, 1, "recv", 0, 2, False, by=0)]]), {"send": 2, "recv": 6})


@pytest.mark.parametrize("level1", ["ring", "hd"])
@pytest.mark.parametrize("n,m", HIER)
def test_hierarchical_every_collective(n, m, level1):
    rng = np.random.default_rng(n * 10 + m)
    kw = {"ranks_per_node": m, "level1": level1}
    for count in (0, 1, 7, 2 * n + 3):
        for red in REDUCE_OPS:
            check(hierarchical.all_reduce(n, count, **kw), "all_reduce", n, count, None, rng, red)
            check(hierarchical.reduce_scatter(n, count, **kw), "reduce_scatter", n, count, None, rng, red)
        check(hierarchical.all_gather(n, count, **kw), "all_gather", n, count, None, rng)
        for root in range(n):
            red = REDUCE_OPS[root % 4]
            check(hierarchical.reduce(n, count, root=root, **kw), "reduce", n, count, root, rng, red)
            check(hierarchical.broadcast(n, count, root=root, **kw), "broadcast", n, count, root, rng)
            check(hierarchical.scatter(n, count, root=root, **kw), "scatter", n, count, root, rng)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_mesh_all_to_all(n):
    rng = np.random.default_rng(7)
    for count in counts_for(n):
        check(mesh.all_to_all(n, count), "all_to_all", n, count, None, rng)


# ---------------------------------------------------------------------------------------------
# in place, determinism

def _in_place_buffers(op, n, count, root, rng):
    if op == "all_reduce":
        bufs = [rng.integers(-3, 4, count).astype(np.int32) for _ in range(n)]
        return bufs, bufs
    if op == "reduce":
        sends = [rng.integers(-3, 4, count).astype(np.int32) for _ in range(n)]
        return sends, [sends[r] if r == root else None for r in range(n)]
    if op == "all_gather":
        recvs = [np.full(count * n, 77, np.int32) for _ in range(n)]
        for r in range(n):
            recvs[r][r * count:(r + 1) * count] = rng.integers(-3, 4, count)
        return [recvs[r][r * count:(r + 1) * count] for r in range(n)], recvs
    if op == "reduce_scatter":
        sends = [rng.integers(-3, 4, count * n).astype(np.int32) for _ in range(n)]
        return sends, [sends[r][r * count:(r + 1) * count] for r in range(n)]
    raise AssertionError(op)


BUILDERS = [("mesh", mesh, {}), ("ring", ring, {}), ("hd", hd, {}),
            ("hier-ring", hierarchical, {"ranks_per_node": 2, "level1": "ring"}),
            ("hier-hd", hierarchical, {"ranks_per_node": 2, "level1": "hd"})]


@pytest.mark.parametrize("op", ["all_reduce", "reduce", "all_gather", "reduce_scatter"])
@pytest.mark.parametrize("name,module,kw", BUILDERS, ids=[b[0] for b in BUILDERS])
def test_in_place(name, module, kw, op):
    rng = np.random.default_rng(3)
    for n in (2, 6, 8):
        for count in (1, 7, 2 * n + 1):
            for root in (range(n) if op == "reduce" else [None]):
                sched = getattr(module, op)(n, count, root=root, **kw)
                validate(sched, buffer_sizes(op, n, count, root=root), in_place=True)
                sends, recvs = _in_place_buffers(op, n, count, root, rng)
                plain = [np.array(s) for s in sends]
                expected = oracle(op, n, count, root, plain, [np.zeros(1, np.int32)] * n)
                run_numpy(sched, sends, recvs)
                for r in range(n):
                    if recvs[r] is not None:
                        np.testing.assert_array_equal(recvs[r], expected[r], err_msg=f"{name} {op} rank {r}")


@pytest.mark.parametrize("name,module,kw", BUILDERS, ids=[b[0] for b in BUILDERS])
def test_float_all_reduce_is_deterministic_and_identical_on_all_ranks(name, module, kw):
    rng = np.random.default_rng(5)
    n, count = 6, 1000
    sched = module.all_reduce(n, count, **kw)
    # mixed magnitudes, so the order of the additions shows in the last bits
    scales = np.float32(10.0) ** rng.integers(-3, 4, n)
    sends = [rng.standard_normal(count).astype(np.float32) * scales[i] for i in range(n)]
    first = run_numpy(sched, sends, [np.zeros(count, np.float32) for _ in range(n)])
    again = run_numpy(sched, sends, [np.zeros(count, np.float32) for _ in range(n)])
    for r in range(n):
        assert first[r].tobytes() == again[r].tobytes() == first[0].tobytes()


def test_fp16_and_bf16_accumulate_in_their_own_dtype():
    for dtype in (np.float16, types.hccl_np_dtype("bf16")):
        sends = [np.full(4, 1.0, dtype), np.full(4, 1e-3, dtype), np.full(4, 1e-3, dtype)]
        recvs = [np.zeros(4, dtype) for _ in range(3)]
        run_numpy(mesh.all_reduce(3, 4), sends, recvs, "sum")
        expected = (sends[0] + sends[1]) + sends[2]  # rank 0's chunk order: own, then 1, 2
        assert recvs[0].dtype == dtype
        np.testing.assert_array_equal(recvs[0][:1], expected[:1])


def test_integer_sum_wraps():
    big = np.iinfo(np.int8).max
    sends = [np.full(3, big, np.int8), np.full(3, 2, np.int8)]
    recvs = [np.zeros(3, np.int8), np.zeros(3, np.int8)]
    run_numpy(ring.all_reduce(2, 3), sends, recvs, types.HCCL_REDUCE_SUM)
    np.testing.assert_array_equal(recvs[1], np.full(3, np.int8(-127)))


# ---------------------------------------------------------------------------------------------
# communication patterns

def _non_local(sched):
    return [t for step in sched.steps for t in step if t.src != t.dst]


@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_ring_talks_only_to_the_left_neighbour(n):
    scheds = [ring.all_reduce(n, 3 * n + 1), ring.all_gather(n, 5), ring.reduce_scatter(n, 5), ring.barrier(n)]
    scheds += [f(n, 9, root=root) for f in (ring.broadcast, ring.reduce, ring.scatter) for root in range(n)]
    for sched in scheds:
        for t in _non_local(sched):
            assert t.src == (t.dst - 1) % n, (sched.op, t)
    assert ring.all_reduce(n, 100).num_steps == 2 * (n - 1)
    assert ring.all_gather(n, 10).num_steps == ring.reduce_scatter(n, 10).num_steps == n - 1


@pytest.mark.parametrize("n", [2, 3, 5, 6, 8, 12, 16])
def test_hd_steps_and_partners(n):
    log = n.bit_length() - 1
    pow2 = n & (n - 1) == 0
    assert hd.all_reduce(n, 1000).num_steps == 2 * log + (0 if pow2 else 2)
    assert hd.reduce_scatter(n, 10).num_steps == log + (0 if pow2 else 2)
    assert hd.broadcast(n, 10, root=n - 1).num_steps == (n - 1).bit_length()
    if pow2:  # every exchange is with the partner differing in exactly one bit
        for t in _non_local(hd.all_reduce(n, 1000)):
            x = t.src ^ t.dst
            assert x & (x - 1) == 0, t


@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_mesh_step_counts(n):
    assert mesh.all_reduce(n, 100).num_steps == 2
    assert mesh.reduce(n, 100, root=1 % n).num_steps == 2
    for f in (mesh.all_gather, mesh.reduce_scatter, mesh.all_to_all, mesh.barrier):
        assert f(n, 10).num_steps == 1
    assert mesh.broadcast(n, n * 1000, root=0).num_steps == 2
    assert mesh.broadcast(n, 3, root=0).num_steps == 1  # small: a direct pull


@pytest.mark.parametrize("level1", ["ring", "hd"])
@pytest.mark.parametrize("n,m", [(8, 4), (12, 4), (16, 4), (6, 2)])
def test_hierarchical_only_level1_crosses_nodes(n, m, level1):
    kw = {"ranks_per_node": m, "level1": level1}
    scheds = [hierarchical.all_reduce(n, 37, **kw), hierarchical.all_gather(n, 5, **kw),
              hierarchical.reduce_scatter(n, 5, **kw), hierarchical.barrier(n, **kw)]
    scheds += [f(n, 23, root=root, **kw) for f in (hierarchical.broadcast, hierarchical.reduce,
                                                     hierarchical.scatter) for root in (0, n - 1, m + 1)]
    for sched in scheds:
        for t in _non_local(sched):
            if t.src // m != t.dst // m:
                assert t.src % m == t.dst % m, (sched.op, t)
    ar = hierarchical.all_reduce(n, 37, **kw)
    for step in (ar.steps[0], ar.steps[-1]):  # intra reduce-scatter first, intra all-gather last
        assert all(t.src // m == t.dst // m for t in step)
    inner = {"ring": ring, "hd": hd}[level1].all_reduce(n // m, 10).num_steps
    assert ar.num_steps == 2 + inner


# ---------------------------------------------------------------------------------------------
# the validator and executor catch bad schedules

def test_validate_detects_a_race():
    # rank 1 reads rank 0's recv while rank 0 writes it in the same step
    bad = make_schedule("test", "all_reduce", 2, 4, None, [[
        Transfer(1, "send", 0, 0, "recv", 0, 4, False),
        Transfer(0, "recv", 2, 1, "recv", 0, 2, False)]])
    with pytest.raises(HcclError, match="race in step 0: rank 1 reads rank 0 recv"):
        validate(bad, {"send": 4, "recv": 4})
    # the same two transfers in separate steps are fine
    ok = make_schedule("test", "all_reduce", 2, 4, None, [[bad.steps[0][0]], [bad.steps[0][1]]])
    validate(ok, {"send": 4, "recv": 4})


def test_validate_detects_in_place_race_only_when_aliased():
    # rank 0 writes recv[0:2]; rank 1 reads rank 0's send[0:2] — a race only if send is recv
    sched = make_schedule("test", "all_reduce", 2, 2, None, [[
        Transfer(1, "send", 0, 0, "recv", 0, 2, False),
        Transfer(0, "send", 0, 1, "recv", 0, 2, False)]])
    validate(sched, {"send": 2, "recv": 2})
    with pytest.raises(HcclError, match="race"):
        validate(sched, {"send": 2, "recv": 2}, in_place=True)


def test_validate_detects_out_of_bounds():
    sched = make_schedule("test", "all_reduce", 2, 4, None, [[Transfer(1, "send", 2, 0, "recv", 0, 3, False)]])
    with pytest.raises(HcclError, match=r"rank 1 send\[2:5\] outside its 4 elements"):
        validate(sched, {"send": 4, "recv": 4})
    with pytest.raises(HcclError, match="tmp"):
        validate(make_schedule("t", "all_reduce", 1, 1, None, [[Transfer(0, "tmp", 0, 0, "recv", 0, 1, False)]]),
                 {"send": 1, "recv": 1, "tmp": 0})


def test_schedule_for_rank_and_tmp_sizing():
    sched = ring.reduce_scatter(4, 3)
    assert sched.tmp_count == 12  # partials laid out like send
    per_rank = sched.for_rank(2)
    assert len(per_rank) == sched.num_steps
    assert all(t.dst == 2 for step in per_rank for t in step)
    assert sum(len(s) for r in range(4) for s in sched.for_rank(r)) == sum(len(s) for s in sched.steps)
    assert isinstance(sched, Schedule) and sched.steps == tuple(tuple(s) for s in sched.steps)


@pytest.mark.parametrize("bad", [dict(world_size=0, count=1), dict(world_size=2, count=-1),
                                 dict(world_size=2, count=1, root=2)])
def test_bad_arguments_raise_para(bad):
    with pytest.raises(HcclError) as e:
        ring.broadcast(bad["world_size"], bad["count"], root=bad.get("root", 0))
    assert e.value.code == types.HCCL_E_PARA


def test_hierarchical_rejects_ranks_per_node_not_dividing_world():
    with pytest.raises(HcclError, match="ranks_per_node=3 must be >= 1 and divide world_size=8"):
        hierarchical.all_reduce(8, 10, ranks_per_node=3)


# ---------------------------------------------------------------------------------------------
# hccl.types

def test_type_values_and_c_names():
    assert types.HCCL_DATA_TYPE_FP32 == 4 and types.HCCL_DATA_TYPE_BFP16 == 11 and types.HCCL_DATA_TYPE_UINT8 == 7
    assert types.HCCL_REDUCE_SUM == 0 and types.HCCL_REDUCE_MIN == 3
    assert types.HCCL_SUCCESS == 0 and types.HCCL_E_TIMEOUT == 9 and types.HCCL_E_PARA == 1
    assert types.HcclResult.HCCL_E_IN_STATUS == 1041
    assert types.hccl_np_dtype(types.HCCL_DATA_TYPE_FP16) == np.float16
    assert types.hccl_np_dtype("bf16") == types.hccl_np_dtype(11)
    assert types.hccl_dtype(np.int64) == types.HcclDataType.INT64
    assert types.hccl_dtype(np.bool_) == types.HcclDataType.UINT8
    assert types.reduce_op("max") == types.reduce_op(2) == types.reduce_op("HCCL_REDUCE_MAX")


def test_type_errors():
    with pytest.raises(HcclError) as e:
        types.hccl_np_dtype(99)
    assert e.value.code == types.HCCL_E_PARA
    with pytest.raises(HcclError) as e:
        types.hccl_np_dtype(types.HcclDataType.INT128)
    assert e.value.code == types.HCCL_E_NOT_SUPPORT
    with pytest.raises(HcclError, match="complex64"):
        types.hccl_np_dtype(np.complex64)
    with pytest.raises(HcclError, match="unknown HcclReduceOp 'avg'"):
        types.reduce_op("avg")


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_apply_reduce_in_place(op):
    dst, src = np.array([1, 5, -2, 7], np.int16), np.array([3, -4, -3, 7], np.int16)
    expected = UFUNC[op](dst, src)
    out = types.apply_reduce(op, dst, src)
    assert out is dst and dst.dtype == np.int16
    np.testing.assert_array_equal(dst, expected)
