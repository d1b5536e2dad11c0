"""Every HCCL collective once, on 8 cards driven from one process, checked against numpy.

    python examples/collectives.py            # cards are Ray actors (an embedded local Ray session)
    python examples/collectives.py --local    # cards inside this process (no Ray)

``hccl.comm_init_all`` makes one communicator per card; each call below is enqueued on every
rank's default stream (asynchronous, like HCCL), then every rank synchronizes and the results are
compared with numpy. Prints one line per collective; exits non-zero if any result is wrong.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import hccl  # noqa: E402
import rt  # noqa: E402

COUNT = 6          # elements per rank (per block for the block-wise collectives)
ROOT = 2


def upload(comm, array):
    rt.set_context(comm.ctx)
    return rt.Tensor.from_numpy(np.ascontiguousarray(array))


def run_all(comms) -> list[tuple[str, bool, str]]:
    """(name, ok, detail) per collective."""
    n = len(comms)
    f32, i32 = hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_DATA_TYPE_INT32
    x = [np.arange(COUNT * n, dtype=np.float32) + 100 * r for r in range(n)]     # rank r's input
    results = []

    def collective(name, inputs, out_len, call, expected, read_inputs=False):
        """Upload inputs, run ``call(rank, comm, in_tensor, out_tensor)`` on every rank, compare the
        outputs (or the inputs, for in-place calls) with ``expected`` (None: not checked)."""
        ins = [upload(c, a) for c, a in zip(comms, inputs)]
        outs = [upload(c, np.zeros(out_len, a.dtype)) for c, a in zip(comms, inputs)]
        for r, c in enumerate(comms):
            call(r, c, ins[r], outs[r])
        for c in comms:
            c.synchronize()
        got = [t.numpy() for t in (ins if read_inputs else outs)]
        bad = [r for r in range(n) if expected[r] is not None and not np.array_equal(got[r], expected[r])]
        detail = "all ranks match numpy" if not bad else f"ranks {bad} differ, e.g. rank {bad[0]}: " \
                                                          f"{got[bad[0]][:6]} vs {expected[bad[0]][:6]}"
        results.append((name, not bad, detail))
        for t in ins + outs:
            t.free()

    first = [a[:COUNT] for a in x]
    collective("all_reduce", first, COUNT,
               lambda r, c, i, o: hccl.all_reduce(i.ptr, o.ptr, COUNT, f32, hccl.HCCL_REDUCE_SUM, c),
               [np.sum(first, axis=0)] * n)
    collective("broadcast", first, COUNT,                 # in place: every rank's buffer is the input
               lambda r, c, i, o: hccl.broadcast(i.ptr, COUNT, f32, ROOT, c),
               [first[ROOT]] * n, read_inputs=True)
    collective("reduce", first, COUNT,
               lambda r, c, i, o: hccl.reduce(i.ptr, o.ptr, COUNT, f32, hccl.HCCL_REDUCE_MAX, ROOT, c),
               [np.max(first, axis=0) if r == ROOT else None for r in range(n)])
    collective("all_gather", first, COUNT * n,
               lambda r, c, i, o: hccl.all_gather(i.ptr, o.ptr, COUNT, f32, c),
               [np.concatenate(first)] * n)
    collective("reduce_scatter", x, COUNT,
               lambda r, c, i, o: hccl.reduce_scatter(i.ptr, o.ptr, COUNT, f32, hccl.HCCL_REDUCE_SUM, c),
               [np.sum(x, axis=0)[r * COUNT:(r + 1) * COUNT] for r in range(n)])
    collective("scatter", x, COUNT,
               lambda r, c, i, o: hccl.scatter(i.ptr, o.ptr, COUNT, f32, ROOT, c),
               [x[ROOT][r * COUNT:(r + 1) * COUNT] for r in range(n)])
    collective("all_to_all", x, COUNT * n,
               lambda r, c, i, o: hccl.all_to_all(i.ptr, COUNT, f32, o.ptr, COUNT, f32, c),
               [np.concatenate([x[j][r * COUNT:(r + 1) * COUNT] for j in range(n)]) for r in range(n)])

    # all_to_all_v: rank i sends (i + j) % 3 elements to rank j, packed; receives packed by source
    cnt = [[(i + j) % 3 for j in range(n)] for i in range(n)]
    ints = [np.arange(3 * n, dtype=np.int32) + 1000 * r for r in range(n)]
    sdis = [list(np.cumsum([0] + cnt[i][:-1])) for i in range(n)]
    rcnt = [[cnt[j][i] for j in range(n)] for i in range(n)]
    rdis = [list(np.cumsum([0] + rcnt[i][:-1])) for i in range(n)]
    want_v = [np.concatenate([ints[j][sdis[j][i]: sdis[j][i] + cnt[j][i]] for j in range(n)]) for i in range(n)]
    want_v = [np.concatenate([w, np.zeros(3 * n - len(w), np.int32)]) for w in want_v]
    collective("all_to_all_v", ints, 3 * n,
               lambda r, c, i, o: hccl.all_to_all_v(i.ptr, cnt[r], sdis[r], i32, o.ptr, rcnt[r], rdis[r], i32, c),
               want_v)

    # send/recv: even ranks send to the next odd rank
    collective("send/recv", first, COUNT,
               lambda r, c, i, o: hccl.send(i.ptr, COUNT, f32, r + 1, c) if r % 2 == 0
               else hccl.recv(o.ptr, COUNT, f32, r - 1, c),
               [first[r - 1] if r % 2 else np.zeros(COUNT, np.float32) for r in range(n)])
    # batch_send_recv: a ring shift, every rank sends right and receives from the left in one batch
    collective("batch_send_recv", first, COUNT,
               lambda r, c, i, o: hccl.batch_send_recv([(hccl.HCCL_SEND, i.ptr, COUNT, f32, (r + 1) % n),
                                                        (hccl.HCCL_RECV, o.ptr, COUNT, f32, (r - 1) % n)], c),
               [first[(r - 1) % n] for r in range(n)])
    collective("barrier", first, COUNT, lambda r, c, i, o: hccl.barrier(c), [np.zeros(COUNT, np.float32)] * n)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--local", action="store_true", help="in-process cards instead of Ray card actors")
    ap.add_argument("--cards", type=int, default=8)
    args = ap.parse_args()
    rt.init(backend="local" if args.local else None)
    try:
        comms = hccl.comm_init_all(list(range(args.cards)))
        print(f"{len(comms)} ranks, one per card, driven from process {os.getpid()} "
              f"({'in-process cards' if args.local else 'Ray card actors'})")
        results = run_all(comms)
        for name, ok, detail in results:
            print(f"{name:16s} {'OK' if ok else 'WRONG'}  {detail}")
        for c in comms:
            hccl.comm_destroy(c)
    finally:
        rt.finalize()
    wrong = [name for name, ok, _ in results if not ok]
    if wrong:
        print(f"FAILED: {', '.join(wrong)}", file=sys.stderr)
        return 1
    print("all collectives OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
