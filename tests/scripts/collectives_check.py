"""Run under `launch`: every collective once against a numpy oracle; prints one line per rank and check.

Used by the two-node test (hierarchical algorithm across nodes) and usable by hand:
    launch --nproc 4 tests/scripts/collectives_check.py
"""

import os

import numpy as np

import hccl
import rt


def data(rank: int, n: int) -> np.ndarray:
    return (np.arange(n, dtype=np.int64) * 7 + rank * 1000 + 1) % 997


def main() -> None:
    comm = hccl.init()
    r, n = comm.rank, comm.size
    info = rt.get_device_info(rt.get_device())
    print(f"rank {r} node {os.environ['NPUSIM_NODE']} card {info.physical_id} algo_nodes "
          f"{len({m[0] for m in comm.members})}", flush=True)
    stream = rt.create_stream()
    # 1003 elements: small enough for one round between the nodes' leaders when the communicator spans
    # nodes; 40009 (313 KiB a rank, over the 256 KiB one-round limit): through the schedules (hierarchical
    # across nodes), every step checked the same way.
    for count, tag in ((1003, "small"), (40009, "large")):
        collectives(comm, stream, r, n, count, tag)
    sweep(comm, stream, r, n)
    mismatch(comm, stream, r)
    hccl.comm_destroy(comm)


def mismatch(comm, stream, r: int) -> None:
    """Rank 1 passes another count — large enough for the schedules — than the others (small: the one-call
    paths): every rank must fail promptly with HCCL_E_PARA, whichever path it took."""
    count = 300_000 if r == 1 else 10
    t = rt.Tensor.from_numpy(np.ones(count, np.int64))
    hccl.all_reduce(t.ptr, t.ptr, count, hccl.HCCL_DATA_TYPE_INT64, hccl.HCCL_REDUCE_SUM, comm, stream)
    try:
        rt.synchronize_stream(stream)
    except hccl.HcclError as e:
        if e.code != hccl.HcclResult.HCCL_E_PARA or "different collectives" not in e.message:
            raise SystemExit(f"rank {r}: mismatched all_reduce failed with {e.code}: {e.message}")
    else:
        raise SystemExit(f"rank {r}: mismatched all_reduce did not fail")
    print(f"rank {r} OK mismatch", flush=True)


def collectives(comm, stream, r: int, n: int, count: int, tag: str) -> None:
    """Every collective once with ``count`` elements per block, against numpy."""
    i64 = hccl.HCCL_DATA_TYPE_INT64
    everyone = [data(k, count * n) for k in range(n)]
    mine = rt.Tensor.from_numpy(everyone[r])
    out = rt.empty(count * n, np.int64)

    def run(name, expect, got_tensor, launch):
        launch()
        rt.synchronize_stream(stream)
        got = got_tensor.numpy()
        if not np.array_equal(got, expect):
            raise SystemExit(f"rank {r}: {name} wrong: {got[:5]} vs {expect[:5]}")
        print(f"rank {r} OK {name} {tag}", flush=True)

    total = np.sum(everyone, axis=0)
    run("all_reduce", total, out,
        lambda: hccl.all_reduce(mine.ptr, out.ptr, count * n, i64, hccl.HCCL_REDUCE_SUM, comm, stream))
    buf = rt.Tensor.from_numpy(everyone[r][:count])
    run("broadcast", everyone[n - 1][:count], buf, lambda: hccl.broadcast(buf.ptr, count, i64, n - 1, comm, stream))
    red = rt.Tensor.from_numpy(np.zeros(count, np.int64))
    expect = np.max([e[:count] for e in everyone], axis=0) if r == 1 else np.zeros(count, np.int64)
    run("reduce", expect, red,
        lambda: hccl.reduce(mine.ptr, red.ptr, count, i64, hccl.HCCL_REDUCE_MAX, 1, comm, stream))
    gathered = rt.empty(count * n, np.int64)
    run("all_gather", np.concatenate([e[:count] for e in everyone]), gathered,
        lambda: hccl.all_gather(mine.ptr, gathered.ptr, count, i64, comm, stream))
    block = rt.empty(count, np.int64)
    run("reduce_scatter", total[r * count:(r + 1) * count], block,
        lambda: hccl.reduce_scatter(mine.ptr, block.ptr, count, i64, hccl.HCCL_REDUCE_SUM, comm, stream))
    run("scatter", everyone[2 % n][r * count:(r + 1) * count], block,
        lambda: hccl.scatter(mine.ptr, block.ptr, count, i64, 2 % n, comm, stream))
    a2a = rt.empty(count * n, np.int64)
    run("all_to_all", np.concatenate([e[r * count:(r + 1) * count] for e in everyone]), a2a,
        lambda: hccl.all_to_all(mine.ptr, count, i64, a2a.ptr, count, i64, comm, stream))
    hccl.barrier(comm, stream)
    rt.synchronize_stream(stream)
    print(f"rank {r} OK barrier {tag}", flush=True)


def sweep(comm, stream, r: int, n: int) -> None:
    """all_reduce for every HCCL dtype and reduce op (small exact values, so every order agrees)."""
    from hccl.types import HcclDataType, hccl_np_dtype as np_dtype
    count = 37
    for code in [c for c in HcclDataType if c.name not in ("INT128", "HIF8", "FP8E4M3", "FP8E5M2", "FP8E8M0",
                                                             "RESERVED")]:
        dtype = np_dtype(code)
        for op, ufunc in (("SUM", np.add), ("PROD", np.multiply), ("MAX", np.maximum), ("MIN", np.minimum)):
            values = [((np.arange(count) + k) % (2 if op == "PROD" else 4) + (1 if op == "PROD" else 0))
                      for k in range(n)]
            inputs = [v.astype(dtype) for v in values]
            expect = inputs[0].copy()
            for v in inputs[1:]:
                expect = ufunc(expect, v).astype(dtype)
            src = rt.Tensor.from_numpy(inputs[r])
            dst = rt.empty(count, dtype)
            hccl.all_reduce(src.ptr, dst.ptr, count, int(code), op, comm, stream)
            rt.synchronize_stream(stream)
            got = dst.numpy()
            if not np.array_equal(got.astype(np.float64), expect.astype(np.float64)):
                raise SystemExit(f"rank {r}: all_reduce {code.name} {op} wrong: {got[:6]} vs {expect[:6]}")
            src.free()
            dst.free()
    print(f"rank {r} OK dtype-op sweep", flush=True)


if __name__ == "__main__":
    main()
