"""The cross-node half of a communicator (``hccl/transport/direct.py``, ``link.py``) without Ray: two "card
processes" (two link servers in this process, on 127.0.0.1) holding ranks {0, 1} and {2, 3, 4} of a 5-rank
communicator, every rank a thread — each small collective against numpy, step data between processes, a call
mismatch, a rank that never arrives and one whose process died, named."""

import threading

import numpy as np
import pytest

from hccl import HcclDataType, HcclError, HcclReduceOp, HcclResult
from hccl.transport.direct import DirectHub, Group
from hccl.transport.link import LinkServer

N = 5
PLACES = [0, 0, 1, 1, 1]           # which process each rank's card is in
NODES = [0, 0, 1, 1, 1]


@pytest.fixture(scope="module")
def links():
    return [LinkServer("127.0.0.1"), LinkServer("127.0.0.1")]


_ids = iter(range(10**6))


def hubs(links):
    comm = f"t{next(_ids)}"
    addresses = [links[p].address for p in PLACES]
    groups = [Group(comm, links[p], addresses, NODES) for p in range(2)]
    return [DirectHub(groups[PLACES[r]], r) for r in range(N)]


def run_all(fn, ranks=range(N)):
    """fn(rank) in a thread per rank; {rank: result or exception}."""
    out = {}

    def one(r):
        try:
            out[r] = fn(r)
        except Exception as e:  # noqa: BLE001 - returned to the test
            out[r] = e
    threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return out


def inputs(count, per_rank):
    return [((np.arange(count * per_rank) * 7 + 13 * r) % 31 - 15).astype(np.float32) for r in range(N)]


@pytest.mark.parametrize("op,rop", [("all_reduce", HcclReduceOp.SUM), ("all_reduce", HcclReduceOp.MAX),
                                    ("reduce", HcclReduceOp.PROD), ("reduce_scatter", HcclReduceOp.SUM),
                                    ("all_gather", None), ("broadcast", None), ("scatter", None),
                                    ("all_to_all", None)])
def test_small_collectives_match_numpy(links, op, rop):
    count, root = 6, 3
    per_rank = N if op in ("reduce_scatter", "scatter", "all_to_all") else 1
    xs = inputs(count, per_rank)
    out_items = count * N if op in ("all_gather", "all_to_all") else count
    p = {"count": count, "dtype": int(HcclDataType.FP32), "op": int(rop) if rop is not None else 0, "root": root}
    hs = hubs(links)

    def rank(r):
        data = xs[r].view(np.uint8) if op not in ("broadcast", "scatter") or r == root else None
        out = np.zeros(out_items, np.float32)
        if op == "broadcast" and r == root:
            out[:] = xs[r]
        problem = hs[r].small(r, 1, f"{op}(count={count})", 0, data, op, p, out.view(np.uint8), "t", 20)
        assert problem is None
        return out
    got = run_all(rank)
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
        else:
            expect = np.concatenate([xs[k][r * count: (r + 1) * count] for k in range(N)])
        np.testing.assert_allclose(got[r], expect, rtol=1e-6)


def test_arrive_returns_every_ranks_call_and_a_mismatch_is_reported_on_every_rank(links):
    hs = hubs(links)
    fps = run_all(lambda r: hs[r].arrive(r, 1, "barrier()", 0, "t", 20))
    assert all(v == ["barrier()"] * N for v in fps.values())
    p = {"count": 4, "dtype": int(HcclDataType.FP32), "op": 0}
    got = run_all(lambda r: hs[r].small(r, 2, "all_reduce(count=4)" if r != 3 else "all_reduce(count=9)", 1,
                                        np.ones(4 if r != 3 else 9, np.float32).view(np.uint8), "all_reduce", p,
                                        np.zeros(4, np.float32).view(np.uint8), "t", 20))
    for r in range(N):
        assert got[r] == ("ranks called different collectives: ranks 0,1,2,4 called all_reduce(count=4); "
                          "rank 3 called all_reduce(count=9)")


def test_step_data_goes_straight_to_the_receiving_ranks_process(links):
    hs = hubs(links)
    a = np.arange(100_000, dtype=np.float64)
    hs[1].send((7, 0, 3), a, 4)
    got = hs[4].recv((7, 0, 3), "t", 7, 20, 1)
    np.testing.assert_array_equal(got, a)
    with pytest.raises(HcclError) as e:
        hs[0].recv((7, 1, 0), "all_reduce #7", 7, 0.3, 2)
    assert e.value.code == HcclResult.HCCL_E_TIMEOUT
    assert "waiting for rank 2 (node 1) to send its part of step 1" in e.value.message


def test_a_rank_that_never_arrives_is_named_with_its_last_collective(links):
    hs = hubs(links)
    run_all(lambda r: hs[r].arrive(r, 1, "barrier()", 0, "t", 20))
    got = run_all(lambda r: hs[r].arrive(r, 2, "barrier()", 1, f"barrier #2 (rank {r})", 1.0), ranks=[0, 1, 2, 3])
    for r in (0, 1):      # the root's group: the root names who never came
        assert isinstance(got[r], HcclError) and got[r].code == HcclResult.HCCL_E_TIMEOUT
        assert got[r].message.startswith(f"barrier #2 (rank {r}): EI0002 timed out after 1 s")
        assert "waiting for ranks [2, 3, 4] (node [1])" in got[r].message
    for r in (2, 3):      # rank 4's own group names it
        assert isinstance(got[r], HcclError) and "waiting for ranks [4] of this node" in got[r].message


def test_a_rank_whose_process_died_fails_every_rank_at_once(links):
    hs = hubs(links)

    def rank(r):
        if r == 4:
            hs[4].left(True)              # its card saw the process go
            return None
        return hs[r].arrive(r, 1, "barrier()", 0, f"barrier #1 (rank {r})", 120)
    got = run_all(rank)
    for r in range(4):
        assert isinstance(got[r], HcclError) and got[r].code == HcclResult.HCCL_E_REMOTE, got[r]
        assert got[r].message == f"barrier #1 (rank {r}): EI0002 rank 4 (node 1) is gone: its process exited"


def test_a_connection_that_never_presents_the_token_is_closed(links, monkeypatch):
    import socket

    from hccl.transport import link
    monkeypatch.setattr(link, "TOKEN_WAIT", 0.2)
    host, port, _ = links[0].address
    with socket.create_connection((host, port), timeout=10) as silent:
        silent.settimeout(10)
        assert silent.recv(1) == b""          # the server gave up on it (without TOKEN_WAIT: blocks, then times out)
