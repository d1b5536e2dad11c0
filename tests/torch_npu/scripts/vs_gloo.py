"""Every c10d collective through the "hccl" backend against torch's gloo backend on the same inputs.

    launch --nproc 3 tests/torch_npu/scripts/vs_gloo.py

Each case runs twice on every rank — once on the default ("hccl") group with npu tensors, once on a gloo group
over the same ranks with CPU tensors — with identical inputs, and the outputs must agree: exactly for integers
and for data movement, within float tolerance for float reductions (the two backends may add in different orders). Where gloo has no
such operation (AVG) the oracle is gloo's SUM divided by the world size. Prints "ALL OK <n> cases".
"""

import os

import torch
import torch.distributed as dist

import torch_npu  # noqa: F401

dist.init_process_group("hccl")
RANK, WORLD = dist.get_rank(), dist.get_world_size()
torch.npu.set_device(int(os.environ["LOCAL_RANK"]))
GLOO = dist.new_group(backend="gloo")
CASES = 0


def data(shape, dtype, salt, rank=RANK):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    lo, hi = (0, 4) if dtype == torch.uint8 else (-3, 4)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def agree(a, b, what, exact):
    global CASES
    CASES += 1
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{what}: {len(a)} vs {len(b)} outputs"
        for i, (x, y) in enumerate(zip(a, b)):
            agree(x, y, f"{what}[{i}]", exact)
        CASES -= 1
        return
    if a is None:
        assert b is None, what
        return
    a = a.cpu()
    if exact:
        assert torch.equal(a, b), f"rank {RANK}: {what}: hccl {a} != gloo {b}"
    else:
        tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(a.dtype, 1e-5)
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"rank {RANK}: {what}: {m}")


def both(what, make, run, exact=True, on=None):
    """``run(inputs, group)`` on hccl and on gloo with equal inputs; every tensor in ``inputs`` is compared
    (on rank ``on`` only, if given: elsewhere c10d leaves the tensors undefined)."""
    h, g = [x.npu() for x in make()], make()
    run(h, None)
    run(g, GLOO)
    if on is None or on == RANK:
        agree(h, g, what, exact)


# -- all_reduce: every HCCL op over every dtype ---------------------------------------------------------------
OPS = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT, "MIN": dist.ReduceOp.MIN, "MAX": dist.ReduceOp.MAX}
# float64 reductions are refused on Ascend910B, as torch_npu refuses them (HCCL has none there)
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int8, torch.uint8]
for name, op in OPS.items():
    for dt in DTYPES:
        exact = not dt.is_floating_point or op in (dist.ReduceOp.MIN, dist.ReduceOp.MAX)
        both(f"all_reduce {name} {dt}", lambda dt=dt: [data((5, 3), dt, 1)],
             lambda ts, grp, op=op: dist.all_reduce(ts[0], op=op, group=grp), exact)
for shape in [(), (0,), (1,), (1 << 16,)]:
    both(f"all_reduce shape {shape}", lambda shape=shape: [data(shape, torch.float32, 2)],
         lambda ts, grp: dist.all_reduce(ts[0], group=grp), exact=False)
both("all_reduce complex64", lambda: [data((4,), torch.complex64, 3)], lambda ts, grp: dist.all_reduce(ts[0], group=grp),
     exact=False)

# AVG: gloo has none; its SUM / world is the oracle
x = data((7,), torch.float32, 4)
avg = x.clone().npu()
dist.all_reduce(avg, op=dist.ReduceOp.AVG)
ref = x.clone()
dist.all_reduce(ref, group=GLOO)
agree(avg, ref / WORLD, "all_reduce AVG", exact=False)

# async Work: wait, is_completed, the future's value
t = data((9,), torch.int64, 5).npu()
ref = t.cpu().clone()
work = dist.all_reduce(t, async_op=True)
assert work.wait() and work.is_completed() and work.is_success()
fut_value = work.get_future().wait()
dist.all_reduce(ref, group=GLOO)
agree(t, ref, "async all_reduce", exact=True)
agree(fut_value[0], ref, "async all_reduce future", exact=True)

# -- broadcast / reduce ----------------------------------------------------------------------------------------
for root in range(WORLD):
    both(f"broadcast root {root}", lambda: [data((6, 2), torch.float32, 6)],
         lambda ts, grp, root=root: dist.broadcast(ts[0], root, group=grp))
both("broadcast bool", lambda: [data((10,), torch.bool, 7)], lambda ts, grp: dist.broadcast(ts[0], 1, group=grp))
for name in ("SUM", "MAX"):
    both(f"reduce {name} to {WORLD - 1}", lambda: [data((8,), torch.int32, 8)],
         lambda ts, grp, name=name: dist.reduce(ts[0], WORLD - 1, op=OPS[name], group=grp), on=WORLD - 1)

# -- gathers -----------------------------------------------------------------------------------------------------
both("all_gather", lambda: [data((3, 2), torch.float16, 9)] + [torch.zeros(3, 2, dtype=torch.float16) for _ in range(WORLD)],
     lambda ts, grp: dist.all_gather(ts[1:], ts[0], group=grp))
both("all_gather_into_tensor", lambda: [data((4,), torch.int64, 10), torch.zeros(4 * WORLD, dtype=torch.int64)],
     lambda ts, grp: dist.all_gather_into_tensor(ts[1], ts[0], group=grp))
stacked, flat = torch.zeros(WORLD, 2, 3).npu(), torch.zeros(WORLD * 2, 3)     # gloo takes the concatenated form only
dist.all_gather_into_tensor(stacked, data((2, 3), torch.float32, 11).npu())
dist.all_gather_into_tensor(flat, data((2, 3), torch.float32, 11), group=GLOO)
agree(stacked, flat.view(WORLD, 2, 3), "all_gather_into_tensor stacked", exact=True)
both("gather to 1", lambda: [data((5,), torch.float64, 12)] + ([torch.zeros(5, dtype=torch.float64) for _ in range(WORLD)]
                                                               if RANK == 1 else []),
     lambda ts, grp: dist.gather(ts[0], ts[1:] if RANK == 1 else None, dst=1, group=grp))

# -- reduce_scatter ---------------------------------------------------------------------------------------------
both("reduce_scatter", lambda: [torch.zeros(4, dtype=torch.int32)] + [data((4,), torch.int32, 13 + r) for r in range(WORLD)],
     lambda ts, grp: dist.reduce_scatter(ts[0], ts[1:], group=grp))
both("reduce_scatter_tensor", lambda: [torch.zeros(3), data((3 * WORLD,), torch.float32, 20)],
     lambda ts, grp: dist.reduce_scatter_tensor(ts[0], ts[1], group=grp), exact=False)
both("reduce_scatter_tensor MAX", lambda: [torch.zeros(3), data((3 * WORLD,), torch.float32, 21)],
     lambda ts, grp: dist.reduce_scatter_tensor(ts[0], ts[1], op=dist.ReduceOp.MAX, group=grp))


def coalesced(kind):
    """Two pairs in one ``_coalescing_manager`` on hccl (one Work: allgather_into_tensor_coalesced /
    reduce_scatter_tensor_coalesced); the same pairs one call at a time on gloo, the oracle."""
    def run(ts, grp):
        pairs = [(ts[0], ts[1]), (ts[2], ts[3])]
        call = dist.all_gather_into_tensor if kind == "all_gather" else dist.reduce_scatter_tensor
        if grp is GLOO:
            for out, inp in pairs:
                call(out, inp, group=grp)
            return
        with dist._coalescing_manager(async_ops=True) as cm:
            for out, inp in pairs:
                call(out, inp)
        cm.wait()
    return run


both("all_gather_into_tensor coalesced", lambda: [torch.zeros(3 * WORLD), data((3,), torch.float32, 70),
                                                  torch.zeros(2 * WORLD, dtype=torch.int32), data((2,), torch.int32, 71)],
     coalesced("all_gather"))
both("reduce_scatter_tensor coalesced", lambda: [torch.zeros(3), data((3 * WORLD,), torch.float32, 72),
                                                 torch.zeros(2, dtype=torch.int64), data((2 * WORLD,), torch.int64, 73)],
     coalesced("reduce_scatter"), exact=False)

# -- scatter ------------------------------------------------------------------------------------------------------
both("scatter from 0", lambda: [torch.zeros(4)] + ([data((4,), torch.float32, 22 + r) for r in range(WORLD)] if RANK == 0 else []),
     lambda ts, grp: dist.scatter(ts[0], ts[1:] if RANK == 0 else None, src=0, group=grp))

# -- all to all, even and uneven -------------------------------------------------------------------------------------
both("all_to_all_single even", lambda: [data((2 * WORLD, 3), torch.float32, 30), torch.zeros(2 * WORLD, 3)],
     lambda ts, grp: dist.all_to_all_single(ts[1], ts[0], group=grp))
send_splits = [(RANK + r) % 3 + 1 for r in range(WORLD)]                      # rows this rank sends to rank r
recv_splits = [(r + RANK) % 3 + 1 for r in range(WORLD)]                      # rows rank r sends to this rank
both("all_to_all_single uneven", lambda: [data((sum(send_splits), 2), torch.int64, 31), torch.zeros(sum(recv_splits), 2, dtype=torch.int64)],
     lambda ts, grp: dist.all_to_all_single(ts[1], ts[0], recv_splits, send_splits, group=grp))
both("all_to_all lists", lambda: [data((2,), torch.float32, 40 + r) for r in range(WORLD)]
     + [torch.zeros(2) for r in range(WORLD)],
     lambda ts, grp: dist.all_to_all(ts[WORLD:], ts[:WORLD], group=grp))
ins = [data((send_splits[r],), torch.float32, 45 + r) for r in range(WORLD)]     # uneven lists: gloo's lists must be
outs = [torch.zeros(recv_splits[r]).npu() for r in range(WORLD)]               # even, so its all_to_all_single is
dist.all_to_all(outs, [t.npu() for t in ins])                                  # the oracle
flat = torch.zeros(sum(recv_splits))
dist.all_to_all_single(flat, torch.cat(ins), recv_splits, send_splits, group=GLOO)
agree(torch.cat([o.cpu() for o in outs]), flat, "all_to_all uneven lists", exact=True)

# -- point to point ----------------------------------------------------------------------------------------------------
def ring(ts, grp):
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    if RANK % 2 == 0:
        dist.send(ts[0], nxt, group=grp)
        dist.recv(ts[1], prv, group=grp)
    else:
        dist.recv(ts[1], prv, group=grp)
        dist.send(ts[0], nxt, group=grp)


both("send/recv ring", lambda: [data((6,), torch.float32, 50), torch.zeros(6)], ring)
both("isend/irecv both directions", lambda: [data((3,), torch.int32, 51), torch.zeros(3, dtype=torch.int32),
                                            data((3,), torch.int32, 52), torch.zeros(3, dtype=torch.int32)],
     lambda ts, grp: [w.wait() for w in (dist.isend(ts[0], (RANK + 1) % WORLD, group=grp),
                                         dist.isend(ts[2], (RANK - 1) % WORLD, group=grp),
                                         dist.irecv(ts[1], (RANK - 1) % WORLD, group=grp),
                                         dist.irecv(ts[3], (RANK + 1) % WORLD, group=grp))])
both("batch_isend_irecv", lambda: [data((4,), torch.float64, 53), torch.zeros(4, dtype=torch.float64)],
     lambda ts, grp: [w.wait() for w in dist.batch_isend_irecv(
         [dist.P2POp(dist.isend, ts[0], (RANK + 1) % WORLD, grp), dist.P2POp(dist.irecv, ts[1], (RANK - 1) % WORLD, grp)])])

# -- objects, barrier, subgroups ----------------------------------------------------------------------------------------
objs = [{"rank": RANK, "list": list(range(RANK))}] if RANK == 0 else [None]
ref_objs = list(objs)
dist.broadcast_object_list(objs, 0)
dist.broadcast_object_list(ref_objs, 0, group=GLOO)
assert objs == ref_objs == [{"rank": 0, "list": []}], objs
gathered, ref_gathered = [None] * WORLD, [None] * WORLD
dist.all_gather_object(gathered, ("r", RANK))
dist.all_gather_object(ref_gathered, ("r", RANK), group=GLOO)
assert gathered == ref_gathered == [("r", r) for r in range(WORLD)], gathered
dist.barrier()
pair = dist.new_group([0, WORLD - 1])
pair_gloo = dist.new_group([0, WORLD - 1], backend="gloo")
if RANK in (0, WORLD - 1):
    a, b = data((5,), torch.int64, 60).npu(), data((5,), torch.int64, 60)
    dist.all_reduce(a, group=pair)
    dist.all_reduce(b, group=pair_gloo)
    agree(a, b, "all_reduce on a subgroup", exact=True)

dist.barrier()
print(f"ALL OK {CASES} cases on rank {RANK}")
dist.destroy_process_group()
