"""One rank of tests/hccl/test_hostpath.py: ``python hostpath_rank.py SCENARIO RANK NRANKS ROOT_HEX``.

Runs SCENARIO against the card this process sees (device 0, see the test's env) and prints one JSON
line: ``{"bad": [...], "errors": [...], "host": {...}}`` — ``bad`` lists wrong results (checked
against numpy here), ``errors`` the HCCL errors raised at synchronize, ``host`` the host path's
counters (how many collectives ran in this process / were handed to the card).
"""

import json
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


def inputs(seed, count, dt):
    """Rank r's input for call ``seed``: small integers, exact in every dtype and summation order."""
    return [((np.arange(count) * 7 + 3 * r + seed) % 11 + 1).astype(dt) for r in range(n)]


def device(a):
    t = rt.Tensor.from_numpy(np.ascontiguousarray(a))
    return t


def check(name, got, want):
    if got.shape != want.shape or not np.array_equal(got, want):
        bad.append(f"{name}: got {got[:8].tolist()} want {want[:8].tolist()}")


def one_round(seed, before=None):
    """Every small collective once (fp32 and int32), each checked against numpy."""
    c = 8
    for dt, code in ((np.float32, hccl.HCCL_DATA_TYPE_FP32), (np.int32, hccl.HCCL_DATA_TYPE_INT32)):
        xs = inputs(seed, c * n, dt)
        mine = xs[rank]
        send, out = device(mine[:c]), rt.empty((c,), dt)
        cases = [("all_reduce sum", lambda: hccl.all_reduce(send.ptr, out.ptr, c, code, hccl.HCCL_REDUCE_SUM, comm),
                  out, lambda: np.sum([x[:c] for x in xs], axis=0).astype(dt)),
                 ("all_reduce max", lambda: hccl.all_reduce(send.ptr, out.ptr, c, code, hccl.HCCL_REDUCE_MAX, comm),
                  out, lambda: np.max([x[:c] for x in xs], axis=0))]
        for name, call, result, want in cases:
            release = before() if before else None
            call()
            if release:
                release()
            rt.synchronize_stream(None)
            check(f"{name} {dt.__name__} #{seed}", result.numpy(), want())
        # an all_reduce large enough to be reduced in two phases (hccl/protocol/staged.py: split_reduce)
        cl = 16384
        xl = [(np.arange(cl) * 5 + 7 * r + seed) % 13 for r in range(n)]
        send_l, out_l = device(xl[rank].astype(dt)), rt.empty((cl,), dt)
        release = before() if before else None
        hccl.all_reduce(send_l.ptr, out_l.ptr, cl, code, hccl.HCCL_REDUCE_SUM, comm)
        if release:
            release()
        rt.synchronize_stream(None)
        check(f"all_reduce split {dt.__name__} #{seed}", out_l.numpy(), np.sum(xl, axis=0).astype(dt))
        send_l.free()
        out_l.free()
        big, gathered = device(mine), rt.empty((c * n,), dt)
        for name, call, result, want in [
            ("reduce", lambda: hccl.reduce(send.ptr, out.ptr, c, code, hccl.HCCL_REDUCE_SUM, 1, comm),
             out, lambda: np.sum([x[:c] for x in xs], axis=0).astype(dt) if rank == 1 else None),
            ("broadcast", lambda: hccl.broadcast(gathered.ptr, c * n, code, n - 1, comm),
             gathered, lambda: xs[n - 1]),
            ("all_gather", lambda: hccl.all_gather(send.ptr, gathered.ptr, c, code, comm),
             gathered, lambda: np.concatenate([x[:c] for x in xs])),
            ("reduce_scatter", lambda: hccl.reduce_scatter(big.ptr, out.ptr, c, code, hccl.HCCL_REDUCE_SUM, comm),
             out, lambda: np.sum(xs, axis=0).astype(dt)[rank * c:(rank + 1) * c]),
            ("scatter", lambda: hccl.scatter(big.ptr, out.ptr, c, code, 0, comm),
             out, lambda: xs[0][rank * c:(rank + 1) * c]),
            ("all_to_all", lambda: hccl.all_to_all(big.ptr, c, code, gathered.ptr, c, code, comm),
             gathered, lambda: np.concatenate([x[rank * c:(rank + 1) * c] for x in xs])),
        ]:
            if name == "broadcast":
                gathered.copy_from(xs[rank])            # root sends its own; the others are overwritten
            release = before() if before else None
            call()
            if release:
                release()
            rt.synchronize_stream(None)
            w = want()
            if w is not None:
                check(f"{name} {dt.__name__} #{seed}", result.numpy(), w)
        release = before() if before else None
        hccl.barrier(comm)
        if release:
            release()
        rt.synchronize_stream(None)
        for t in (send, out, big, gathered):
            t.free()


def host_counts():
    hp = comm.host_path()
    return {"done": hp.done, "handed": hp.handed} if hp is not None else None


if scenario == "all":                       # every rank on the host path
    for seed in range(3):
        one_round(seed)
elif scenario == "mixed":                   # odd ranks' streams are busy: they go through their cards
    def hold_stream():
        """Keep the default stream busy until the collective is issued: a blocking host callback that waits for
        the release (a sleep kernel could finish first on a loaded machine, and the call would find it idle)."""
        go = threading.Event()
        rt.launch_callback(lambda _: go.wait(30), None, True)
        return go.set
    for seed in range(2):
        one_round(seed, before=hold_stream if rank % 2 else None)
elif scenario == "late":                    # rank 0 arrives late: the others hand over to their cards
    t = device(np.full(4, rank + 1, np.float32))
    for i in range(3):
        if rank == 0:
            time.sleep(0.3)
        hccl.all_reduce(t.ptr, t.ptr, 4, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm)
        rt.synchronize_stream(None)
    total = n * (n + 1) // 2 * n ** 2      # three in-place sums of (r+1): sum * n^2
    check("late", t.numpy(), np.full(4, total, np.float32))
elif scenario == "late_split":              # rank 0 is late for the second phase of a split all_reduce
    import hccl.hostpath

    count = 16384
    if rank == 0:
        real = hccl.hostpath.fast_split

        def slow_split(ctrl, r, p):
            own, gather = real(ctrl, r, p)

            def late_own(parity, recv):
                own(parity, recv)
                time.sleep(0.3)
            return late_own, gather
        hccl.hostpath.fast_split = slow_split
    t = device(np.arange(count, dtype=np.float32) % 7 + rank)
    for i in range(3):
        hccl.all_reduce(t.ptr, t.ptr, count, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm)
        rt.synchronize_stream(None)
    want = np.arange(count, dtype=np.float32) % 7 + np.arange(n).mean()     # the ranks' mean input, then
    check("late_split", t.numpy(), want * n ** 3)                            # three sums: times n^3
elif scenario == "hazard":                  # rank 0's all_reduce must not block its later send
    a, b = rt.create_stream(), rt.create_stream()
    t, msg = device(np.full(4, rank + 1, np.float32)), device(np.full(2, 7 * (rank + 1), np.int32))
    if rank == 0:
        hccl.all_reduce(t.ptr, t.ptr, 4, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm, a)
        hccl.send(msg.ptr, 2, hccl.HCCL_DATA_TYPE_INT32, 1, comm, b)
    elif rank == 1:
        hccl.recv(msg.ptr, 2, hccl.HCCL_DATA_TYPE_INT32, 0, comm, a)
        hccl.all_reduce(t.ptr, t.ptr, 4, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm, a)
    else:
        hccl.all_reduce(t.ptr, t.ptr, 4, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm, a)
    rt.synchronize_stream(a)
    rt.synchronize_stream(b)
    check("hazard sum", t.numpy(), np.full(4, n * (n + 1) / 2, np.float32))
    if rank == 1:
        check("hazard message", msg.numpy(), np.full(2, 7, np.int32))
elif scenario == "landing":                 # a device-to-host copy into numpy has landed after synchronize
    t = device(np.arange(4096, dtype=np.float32) + rank)
    for i in range(100):
        host = np.zeros(4096, np.float32)
        rt.memcpy_async(host, host.nbytes, t.ptr, t.nbytes, rt.ACL_MEMCPY_DEVICE_TO_HOST, None)
        sum(range(20000))                   # host work while the copy's notification is in flight
        rt.synchronize_stream(None)
        if host[-1] != 4095 + rank:
            bad.append(f"copy {i} not landed after synchronize_stream")
            break
elif scenario == "mismatch":                # rank 0 passes another count: every rank gets HCCL_E_PARA
    t = device(np.ones(64, np.float32))
    count = 64 if rank == 0 else 32
    hccl.all_reduce(t.ptr, t.ptr, count, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm)
    try:
        rt.synchronize_stream(None)
    except hccl.HcclError as e:
        errors.append([e.code, e.message])
    # the communicator still works afterwards
    hccl.all_reduce(t.ptr, t.ptr, 4, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm)
    rt.synchronize_stream(None)
    check("after mismatch", t.numpy()[:4], np.full(4, n, np.float32))
elif scenario == "gave_up":                 # rank 0 comes after the others' HCCL_EXEC_TIMEOUT: all of them fail
    t = device(np.ones(4, np.float32))
    hccl.all_reduce(t.ptr, t.ptr, 4, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm)   # in step first
    rt.synchronize_stream(None)
    if rank == 0:
        time.sleep(4)
    hccl.all_reduce(t.ptr, t.ptr, 4, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm)
    try:
        rt.synchronize_stream(None)
        bad.append(f"all_reduce completed with {t.numpy().tolist()} after the others gave up")
    except hccl.HcclError as e:
        errors.append([e.code, e.message])
elif scenario == "reuse":                   # one call signature again after its output buffer was freed
    c, FP32 = 64, hccl.HCCL_DATA_TYPE_FP32
    send, out = device(np.full(c, rank + 1, np.float32)), rt.empty((c,), np.float32)
    for i in range(3):
        send.copy_from(np.full(c, (rank + 1) * (i + 1), np.float32))
        hccl.all_reduce(send.ptr, out.ptr, c, FP32, hccl.HCCL_REDUCE_SUM, comm)
        rt.synchronize_stream(None)
        check(f"reuse #{i}", out.numpy(), np.full(c, n * (n + 1) / 2 * (i + 1), np.float32))
    done_before, ptr = comm.host_path().done, out.ptr
    out.free()
    hccl.all_reduce(send.ptr, ptr, c, FP32, hccl.HCCL_REDUCE_SUM, comm)   # the same signature, a freed buffer
    try:
        rt.synchronize_stream(None)
        bad.append("a collective into a freed buffer succeeded")
    except (hccl.HcclError, rt.AclError) as e:
        errors.append([int(e.code), str(e)])
    if comm.host_path().done != done_before:
        bad.append("the host path wrote through its view of a freed buffer")
else:
    raise SystemExit(f"unknown scenario {scenario}")

print(json.dumps({"bad": bad, "errors": errors, "host": host_counts()}), flush=True)
hccl.comm_destroy(comm)
rt.finalize()
