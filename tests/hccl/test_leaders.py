"""The exchange between node leaders' own processes (``hccl/transport/leaders.py``) without Ray: three nodes' leader
links in threads of this process on 127.0.0.1 — nodes {0, 1}, {2, 3}, {4} — run rounds of a reduction against
numpy over connections kept from round to round; a node's own failure report, a leader process whose connection
ends, a root that is gone, a late node and a stranger without the token are each named."""

import socket
import threading

import numpy as np
import pytest

from hccl import HcclResult
from hccl.transport import leaders
from hccl.transport.direct import Failed, Partial
from hccl.transport.link import TOKEN_BYTES

NODES = ["a", "a", "b", "b", "c"]
GROUPS = [[0, 1], [2, 3], [4]]
_ids = iter(range(10**6))


@pytest.fixture
def links():
    listener = leaders.listener("127.0.0.1")
    comm = f"lead{next(_ids)}"
    made = [leaders.LeaderLink(comm, k, GROUPS, [listener.address] * 3, NODES) for k in range(3)]
    yield made
    for link in made:
        link.close()


def part(k: int, seq: int) -> tuple[Partial, np.ndarray]:
    """Node k's partial sum of round seq: the sum of its ranks' inputs."""
    inputs = [np.arange(6, dtype=np.float32) * (r + 1) + seq for r in GROUPS[k]]
    acc = np.sum(inputs, axis=0, dtype=np.float32)
    return Partial({"all_reduce(count=6)": GROUPS[k]}, {r: seq - 1 for r in GROUPS[k]}, acc.view(np.uint8)), acc


SPEC = {"op": "all_reduce", "dtype": 4, "op_code": 0, "root": None, "count": 6}     # fp32 sum


def run(links, seq, skip=(), timeout=20.0):
    """Every node's leader exchanges its part of round ``seq`` (nodes in ``skip`` do not): result or error each."""
    out = {}

    def one(k):
        try:
            out[k] = links[k].exchange(seq, part(k, seq)[0], SPEC, timeout)
        except Failed as e:
            out[k] = e
    threads = [threading.Thread(target=one, args=(k,)) for k in range(3) if k not in skip]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return out


def test_rounds_of_a_reduction_across_three_nodes_match_numpy(links):
    for seq in (1, 2, 3):                          # the connections opened in round 1 carry the next ones
        out = run(links, seq)
        expect = sum(part(k, seq)[1] for k in range(3))
        for k in range(3):
            got = np.frombuffer(out[k].acc, np.float32)
            np.testing.assert_allclose(got, expect, rtol=1e-6)
            assert sorted(r for ranks in out[k].fps.values() for r in ranks) == list(range(5))
        # the root keeps every rank's last completed collective for its reports; the answers do not carry it
        assert out[0].done == {r: seq - 1 for r in range(5)} and out[1].done == out[2].done == {}
        assert links[0].last_done == dict.fromkeys(range(5), seq)


def test_a_nodes_own_failure_report_reaches_every_node(links):
    run(links, 1)
    out = {}
    report = Failed(HcclResult.HCCL_E_TIMEOUT, "EI0002 timed out waiting for ranks [3] of node b to call it")
    t = threading.Thread(target=lambda: out.update(root=_catch(lambda: links[0].exchange(2, part(0, 2)[0], SPEC, 20))))
    t2 = threading.Thread(target=lambda: out.update(c=_catch(lambda: links[2].exchange(2, part(2, 2)[0], SPEC, 20))))
    t.start()
    t2.start()
    links[1].fail(2, report)
    t.join(30)
    t2.join(30)
    for got in out.values():
        assert isinstance(got, Failed) and got.code == HcclResult.HCCL_E_TIMEOUT and "ranks [3] of node b" in got.detail


def test_a_leader_whose_connection_ends_is_named_as_gone(links):
    run(links, 1)
    links[1].root.close()                        # node b's leader process exits: its connection ends
    out = run(links, 2, skip=(1,))
    for k in (0, 2):
        assert isinstance(out[k], Failed) and out[k].code == HcclResult.HCCL_E_REMOTE
        assert "rank 2 (node b) is gone: its process exited" in out[k].detail


def test_a_root_that_is_gone_is_named_by_the_others(links):
    run(links, 1)
    for conn in links[0].conns.values():         # the root's process exits: every connection to it ends
        conn.close()
    out = run(links, 2, skip=(0,))
    for k in (1, 2):
        assert isinstance(out[k], Failed) and out[k].code == HcclResult.HCCL_E_REMOTE
        assert "rank 0 (node a), which leads the exchange between nodes, is gone" in out[k].detail


def test_a_node_that_never_sends_its_part_times_out_naming_its_ranks(links, monkeypatch):
    monkeypatch.setattr(leaders, "REPORT_GRACE", 0.1)
    out = run(links, 1, skip=(2,), timeout=0.5)
    assert isinstance(out[0], Failed) and out[0].code == HcclResult.HCCL_E_TIMEOUT
    assert "waiting for ranks [4] (node ['c'])" in out[0].detail and "rank 4 (node c)" in out[0].detail
    assert isinstance(out[1], Failed) and out[1].detail == out[0].detail


def test_a_connection_without_the_token_is_never_taken():
    listener = leaders.listener("127.0.0.1")
    host, port, _ = listener.address
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"\0" * TOKEN_BYTES)
        leaders._send(s, ["lead", "stranger", 1])
        assert listener.take("stranger", 1, 0.5) is None
        s.settimeout(5)
        try:
            got = s.recv(1)
        except ConnectionResetError:             # closed with the frame unread
            got = b""
        assert got == b""                        # dropped


def test_host_led_needs_every_node_leader_to_listen():
    addr = ["127.0.0.1", 1, "00"]
    members = [[0, 0, 1], [0, 1, 2], [1, 0, 3], [1, 1, 4]]
    assert leaders.host_led(members, [addr, None, addr, None])          # only the leaders (0, 2) count
    assert not leaders.host_led(members, [addr, addr, None, addr])
    assert not leaders.host_led(members[:2], [addr, addr])              # one node: nothing crosses nodes


def _catch(fn):
    try:
        return fn()
    except Failed as e:
        return e
