"""One rank of tests/hccl/test_hostlarge.py: ``python hostlarge_rank.py SCENARIO RANK NRANKS ROOT_HEX``.

Runs SCENARIO (large collectives, above the stages' 256 KiB, which the rank's process runs itself when it may:
``hccl/hostsched.py``) against the card this process sees and prints one JSON line: ``{"bad": [...],
"errors": [...], "host": {...}}`` — ``bad`` lists wrong results (checked against numpy here), ``errors`` the
HCCL errors raised at synchronize, ``host`` the host path's counters (run here / handed to the card).
"""

import json
import os
import sys
import threading
import time

import numpy as np

import hccl
import rt

scenario, rank, n, root = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rt.init()
rt.set_device(0)
comm = hccl.comm_init_root_info(n, hccl.RootInfo.from_bytes(bytes.fromhex(root)), rank)
bad, errors = [], []
C = 80 * 1024 + 3               # elements per rank: 320 KiB of fp32, beyond the stages; not a multiple of n
FP32, INT32 = hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_DATA_TYPE_INT32
SUM = hccl.HCCL_REDUCE_SUM


def inputs(seed, count, dt):
    """Rank r's input for call ``seed``: small integers, exact in every dtype and summation order."""
    return [((np.arange(count) * 7 + 3 * r + seed) % 11 + 1).astype(dt) for r in range(n)]


def device(a):
    return rt.Tensor.from_numpy(np.ascontiguousarray(a))


def check(name, got, want, exact=True):
    same = got.shape == want.shape and (np.array_equal(got, want) if exact else np.allclose(got, want, rtol=1e-5, atol=1e-5))
    if not same:
        diff = np.flatnonzero(got != want)[:4].tolist() if got.shape == want.shape else "shape"
        bad.append(f"{name}: differs at {diff}: got {got[:4].tolist()} want {want[:4].tolist()}")


def one_round(seed, before=None):
    """Every large collective with a host schedule once (fp32 and int32; max and sum), checked against numpy."""
    c = C
    for dt, code in ((np.float32, FP32), (np.int32, INT32)):
        xs = inputs(seed, c * n, dt)
        mine = xs[rank]
        send, out, big, gathered = device(mine[:c]), rt.empty((c,), dt), device(mine), rt.empty((c * n,), dt)
        inplace = device(mine[:c])
        cases = [
            ("all_reduce sum", lambda: hccl.all_reduce(send.ptr, out.ptr, c, code, SUM, comm),
             out, lambda: np.sum([x[:c] for x in xs], axis=0).astype(dt)),
            ("all_reduce max", lambda: hccl.all_reduce(send.ptr, out.ptr, c, code, hccl.HCCL_REDUCE_MAX, comm),
             out, lambda: np.max([x[:c] for x in xs], axis=0)),
            ("all_reduce in place", lambda: hccl.all_reduce(inplace.ptr, inplace.ptr, c, code, SUM, comm),
             inplace, lambda: np.sum([x[:c] for x in xs], axis=0).astype(dt)),
            ("broadcast", lambda: hccl.broadcast(gathered.ptr, c * n, code, n - 1, comm), gathered, lambda: xs[n - 1]),
            ("all_gather", lambda: hccl.all_gather(send.ptr, gathered.ptr, c, code, comm),
             gathered, lambda: np.concatenate([x[:c] for x in xs])),
            ("reduce_scatter", lambda: hccl.reduce_scatter(big.ptr, out.ptr, c, code, SUM, comm),
             out, lambda: np.sum(xs, axis=0).astype(dt)[rank * c:(rank + 1) * c]),
            ("scatter", lambda: hccl.scatter(big.ptr, out.ptr, c, code, 0, comm),
             out, lambda: xs[0][rank * c:(rank + 1) * c]),
            ("all_to_all", lambda: hccl.all_to_all(big.ptr, c, code, gathered.ptr, c, code, comm),
             gathered, lambda: np.concatenate([x[rank * c:(rank + 1) * c] for x in xs])),
        ]
        for name, call, result, want in cases:
            if name == "broadcast":
                gathered.copy_from(xs[rank])            # root sends its own; the others are overwritten
            release = before() if before else None
            call()
            if release:
                release()
            rt.synchronize_stream(None)
            check(f"{name} {dt.__name__} #{seed}", result.numpy(), want())
        for t in (send, out, big, gathered, inplace):
            t.free()


def random_sum(seed):
    """fp32 all_reduce of random data (every rank's result identical bits, close to numpy's sum)."""
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(C).astype(np.float32) for _ in range(n)]
    send, out = device(xs[rank]), rt.empty((C,), np.float32)
    hccl.all_reduce(send.ptr, out.ptr, C, FP32, SUM, comm)
    rt.synchronize_stream(None)
    got = out.numpy()
    check(f"random sum #{seed}", got, np.sum(xs, axis=0, dtype=np.float64).astype(np.float32), exact=False)
    send.free()
    out.free()
    return got


def hold_stream():
    """Keep the default stream busy until the collective is issued (a blocking host callback): the card runs it."""
    go = threading.Event()
    rt.launch_callback(lambda _: go.wait(30), None, True)
    return go.set


def host_counts():
    hp = comm.host_path()
    return {"done": hp.done, "handed": hp.handed} if hp is not None else None


digest = None
if scenario == "all":                       # every rank on the host path
    one_round(0)
    digest = random_sum(7).tobytes().hex()[:64]
elif scenario == "mixed":                   # odd ranks' streams are busy: they go through their cards
    for seed in range(2):
        one_round(seed, before=hold_stream if rank % 2 else None)
    digest = random_sum(7).tobytes().hex()[:64]
elif scenario == "midway":                  # a step barrier never waits here: the card takes over between steps
    import hccl.hostsched
    hccl.hostsched.MID_WAIT = 0.0
    one_round(1)
    digest = random_sum(7).tobytes().hex()[:64]
elif scenario == "late":                    # rank 0 arrives late: the others hand over to their cards
    t = device(np.full(C, rank + 1, np.float32))
    for i in range(3):
        if rank == 0:
            time.sleep(0.3)
        hccl.all_reduce(t.ptr, t.ptr, C, FP32, SUM, comm)
        rt.synchronize_stream(None)
    total = n * (n + 1) // 2 * n ** 2      # three in-place sums of (r+1): sum * n^2
    check("late", t.numpy(), np.full(C, total, np.float32))
elif scenario == "dead":                    # the last rank's process exits before the second collective
    t = device(np.full(C, rank + 1, np.float32))
    hccl.all_reduce(t.ptr, t.ptr, C, FP32, SUM, comm)
    rt.synchronize_stream(None)
    if rank == n - 1:
        print(json.dumps({"bad": bad, "errors": errors, "host": host_counts()}), flush=True)
        os._exit(0)
    hccl.all_reduce(t.ptr, t.ptr, C, FP32, SUM, comm)
    try:
        rt.synchronize_stream(None)
        bad.append("an all_reduce with a dead peer succeeded")
    except hccl.HcclError as e:
        errors.append([int(e.code), e.message])
elif scenario == "mismatch":                # rank 0 passes another count: every rank gets HCCL_E_PARA
    t = device(np.ones(2 * C, np.float32))
    count = 2 * C if rank == 0 else C
    hccl.all_reduce(t.ptr, t.ptr, count, FP32, SUM, comm)
    try:
        rt.synchronize_stream(None)
    except hccl.HcclError as e:
        errors.append([int(e.code), e.message])
    t.copy_from(np.ones(2 * C, np.float32))
    hccl.all_reduce(t.ptr, t.ptr, C, FP32, SUM, comm)          # the communicator still works afterwards
    rt.synchronize_stream(None)
    check("after mismatch", t.numpy()[:C], np.full(C, n, np.float32))
else:
    raise SystemExit(f"unknown scenario {scenario}")

print(json.dumps({"bad": bad, "errors": errors, "host": host_counts(), "digest": digest}), flush=True)
hccl.comm_destroy(comm)
rt.finalize()
