"""The node-staged protocol's pieces (``hccl/protocol/nodestaged.py``) without Ray: two simulated nodes, each its
own control block and link server on 127.0.0.1, ranks {0, 1, 2} and {3, 4}; every rank stages its input in its
node's block, each node's leader builds the node's part, runs the round across nodes (``NodeGroup.exchange``)
and writes the node's result, every rank takes its part — against numpy for every small collective; a
mismatch is written as such and read by every rank."""

import threading

import numpy as np
import pytest

from hccl import HcclDataType, HcclReduceOp, HcclResult
from hccl.protocol import nodestaged
from hccl.protocol.ctrlblock import DONE, ControlBlock
from hccl.protocol.staged import stage_source
from hccl.transport.direct import NodeGroup
from hccl.transport.link import LinkServer
from hccl.types import hccl_dtype

N = 5
NODES = [0, 0, 0, 1, 1]
LOCAL = [[0, 1, 2], [3, 4]]


@pytest.fixture(scope="module")
def links():
    return [LinkServer("127.0.0.1"), LinkServer("127.0.0.1")]


_ids = iter(range(10**6))


def run_round(links, seq, op, p, inputs, fps):
    """Stage every rank's input and call, run both nodes' leaders in threads; every rank's result (or failure)."""
    comm = f"ns{next(_ids)}"
    addresses = [links[NODES[r]].address for r in range(N)]
    blocks = [ControlBlock(np.zeros(ControlBlock.nbytes(N), np.uint8), N) for _ in LOCAL]
    for r in range(N):
        ctrl = blocks[NODES[r]]
        data = inputs[r]
        if data is not None and stage_source(op, p, r):
            ctrl.stage(r, seq % 2)[:data.nbytes] = data.view(np.uint8)
        ctrl.set_fingerprint(r, seq, fps[r])
    groups = [NodeGroup(comm, links[k], addresses, NODES) for k in range(2)]
    errors = {}

    def lead(k):
        leader = LOCAL[k][0]
        try:
            part = nodestaged.node_part(blocks[k], LOCAL[k], seq, op, p, N)
            total = groups[k].exchange(seq, groups[k].node_index(leader), part, nodestaged.spec_of(op, p), 20)
            nodestaged.write_result(blocks[k], leader, seq, op, p, total, N)
        except Exception as e:  # noqa: BLE001 - returned to the test
            errors[k] = e
    threads = [threading.Thread(target=lead, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads), errors
    out = {}
    for r in range(N):
        items = p["count"] * (N if op in ("all_gather", "all_to_all") else 1)
        recv = np.zeros(items, np.float32)
        if op == "broadcast" and r == p["root"]:
            recv[:] = inputs[r]
        got = nodestaged.take_result(blocks[NODES[r]], LOCAL[NODES[r]][0], r, seq, op, p, N, recv.view(np.uint8))
        out[r] = recv if got is None else got
    return out


@pytest.mark.parametrize("op,rop", [("all_reduce", HcclReduceOp.SUM), ("all_reduce", HcclReduceOp.MAX),
                                    ("reduce", HcclReduceOp.PROD), ("reduce_scatter", HcclReduceOp.SUM),
                                    ("all_gather", None), ("broadcast", None), ("scatter", None),
                                    ("all_to_all", None), ("barrier", None)])
@pytest.mark.parametrize("seq", [1, 2])
def test_every_small_collective_matches_numpy(links, op, rop, seq):
    count, root = 6, 3
    per_rank = N if op in ("reduce_scatter", "scatter", "all_to_all") else 1
    xs = [((np.arange(count * per_rank) * 7 + 13 * r) % 31 - 15).astype(np.float32) for r in range(N)]
    p = {"count": count, "dtype": int(HcclDataType.FP32), "op": int(rop) if rop is not None else 0, "root": root}
    got = run_round(links, seq, op, p, xs, [f"{op}(count={count})"] * N)
    stack = np.stack(xs)
    ufunc = {HcclReduceOp.SUM: np.add, HcclReduceOp.MAX: np.maximum, HcclReduceOp.PROD: np.multiply}.get(rop)
    for r in range(N):
        if op in ("all_reduce", "reduce"):
            expect = ufunc.reduce(stack, axis=0)
        elif op == "reduce_scatter":
            expect = np.add.reduce(stack, axis=0)[r * count: (r + 1) * count]
        elif op == "all_gather":
            expect = stack.reshape(-1)
        elif op == "broadcast":
            expect = xs[root]
        elif op == "scatter":
            expect = xs[root][r * count: (r + 1) * count]
        elif op == "all_to_all":
            expect = np.concatenate([xs[k][r * count: (r + 1) * count] for k in range(N)])
        else:
            expect = np.zeros(count, np.float32)
        np.testing.assert_allclose(got[r], expect, rtol=1e-6)


def test_calls_that_disagree_across_nodes_are_told_to_every_rank(links):
    p = {"count": 4, "dtype": int(HcclDataType.FP32), "op": 0}
    fps = ["all_reduce(count=4)"] * N
    fps[4] = "all_reduce(count=9)"
    got = run_round(links, 7, "all_reduce", p, [np.ones(4, np.float32)] * N, fps)
    for r in range(N):
        kind, code, text = got[r]
        assert (kind, code) == (nodestaged.DISAGREE, HcclResult.HCCL_E_PARA)
        assert text == "ranks called different collectives: ranks 0-3 called all_reduce(count=4); rank 4 called " \
                       "all_reduce(count=9)"
        error = nodestaged.error_of(got[r], "c", 7, "w")
        assert error.code == HcclResult.HCCL_E_PARA and error.message == f"collective #7 on comm 'c': {text}"


def test_a_rank_reading_a_parity_the_leader_has_not_written_gets_a_named_failure():
    ctrl = ControlBlock(np.zeros(ControlBlock.nbytes(2), np.uint8), 2)
    kind, code, text = nodestaged.take_result(ctrl, 0, 1, 3, "barrier", {"count": 0, "dtype": 0}, 2, None)
    assert (kind, code) == (nodestaged.FAILED, HcclResult.HCCL_E_INTERNAL)
    assert text == "EI0002 rank 0, which leads this node's exchange, left no result for collective #3"


@pytest.mark.parametrize("dtype,rop", [(np.float32, HcclReduceOp.SUM), (np.float16, HcclReduceOp.SUM),
                                       (np.int8, HcclReduceOp.SUM), (np.float32, HcclReduceOp.PROD)])
def test_the_part_of_consecutive_ranks_is_their_rank_by_rank_reduction(dtype, rop):
    # node_part's one-call reduction over the node's consecutive ranks against the loop it replaces: the same
    # elementwise operations in the same order, so the same bits (int8 wraps alike); ranks 3 and 5 of 2-6 swap
    # places in a second, non-consecutive call, which takes the loop
    n, count, seq = 8, 1000, 3
    ctrl = ControlBlock(np.zeros(ControlBlock.nbytes(n), np.uint8), n)
    rng = np.random.default_rng(7)
    xs = [(rng.standard_normal(count) * (3 if rop == HcclReduceOp.PROD else 60)).astype(dtype) for _ in range(n)]
    p = {"count": count, "dtype": int(hccl_dtype(np.dtype(dtype))), "op": int(rop)}
    for r in range(n):
        ctrl.stage(r, seq % 2)[:xs[r].nbytes] = xs[r].view(np.uint8)
        ctrl.set_fingerprint(r, seq, "all_reduce(same)")
        ctrl.slots[r, DONE] = seq - 1
    ufunc = np.multiply if rop == HcclReduceOp.PROD else np.add

    def by_rank(order):
        acc = xs[order[0]].copy()
        for r in order[1:]:
            ufunc(acc, xs[r], out=acc, casting="unsafe")
        return acc.tobytes()
    part = nodestaged.node_part(ctrl, [2, 3, 4, 5, 6], seq, "all_reduce", p, n)
    assert bytes(part.acc) == by_rank([2, 3, 4, 5, 6])
    assert part.fps == {"all_reduce(same)": [2, 3, 4, 5, 6]} and part.done == dict.fromkeys(range(2, 7), seq - 1)
    loop = nodestaged.node_part(ctrl, [2, 5, 4, 3, 6], seq, "all_reduce", p, n)
    assert bytes(loop.acc) == by_rank([2, 5, 4, 3, 6])
    ctrl.set_fingerprint(4, seq, "all_reduce(other)")          # one rank disagrees: no data, both calls named
    part = nodestaged.node_part(ctrl, [2, 3, 4, 5, 6], seq, "all_reduce", p, n)
    assert part.acc is None and part.fps == {"all_reduce(same)": [2, 3, 5, 6], "all_reduce(other)": [4]}
