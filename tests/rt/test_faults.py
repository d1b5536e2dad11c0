"""Fault injection in one process (``rt.faults``, in-process cards: no Ray): the spec parser, and the faults
whose error a genuine failure of the same kind can be compared with here — fail, corrupt, delay, oom, ecc —
plus restart= and rank selection. The process-level faults (kill, kill_card, hang) and launch are in
tests/launcher/launch/test_fault_injection.py."""

import re
import time

import numpy as np
import pytest

import hccl  # noqa: F401  registers HcclResult as the codes of fail faults (hccl/diag.py)
import rt
from rt import faults
from rt.diag.faults import FAULTS

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _clean_faults(monkeypatch):
    for name in ("NPUSIM_FAULTS", "RANK", "RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    faults.clear()
    yield
    faults.clear()


def _two_ranks(rt_local, monkeypatch, timeout="60"):
    """Two communicators driven from this thread (comm_init_all), each with a tensor of ones."""
    import hccl
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", timeout)
    comms = hccl.comm_init_all([0, 1])
    return comms


def _ones(comm, n=16, value=1.0):
    rt.set_device(comm.device)
    return rt.Tensor.from_numpy(np.full(n, value, np.float32))


def _sync(comm):
    """None, or the NpuError the covering synchronize raises on ``comm``'s card."""
    rt.set_device(comm.device)
    try:
        rt.synchronize_stream(None)
    except rt.NpuError as e:
        return e
    return None


# ------------------------------------------------------------------------------------------------ parsing
def test_a_spec_parses_into_faults_with_defaults():
    fs = faults.parse(" kill:rank=1:collective=3 ; hang:rank=0:p2p=2:restart=1;;"
                      "fail:rank=2:collective=1:code=hccl_e_remote;fail:rank=2:collective=2:code=9;"
                      "oom:card=3:malloc=5:node=1;ecc:card=0;ecc:card=1:sync=4;delay:rank=0:collective=1:ms=250;"
                      "corrupt:rank=1:collective=2:bytes=8;kill_card:card=2:collective=7")
    got = [(f.action, f.rank, f.card, f.node, f.trigger, f.at, f.restart) for f in fs]
    assert got == [("kill", 1, None, 0, "collective", 3, 0), ("hang", 0, None, 0, "p2p", 2, 1),
                   ("fail", 2, None, 0, "collective", 1, 0), ("fail", 2, None, 0, "collective", 2, 0),
                   ("oom", None, 3, 1, "malloc", 5, 0), ("ecc", None, 0, 0, "sync", 1, 0),
                   ("ecc", None, 1, 0, "sync", 4, 0), ("delay", 0, None, 0, "collective", 1, 0),
                   ("corrupt", 1, None, 0, "collective", 2, 0), ("kill_card", None, 2, 0, "collective", 7, 0)]
    assert [fs[2].code, fs[3].code, fs[7].ms, fs[8].nbytes] == [21, 9, 250, 8]
    assert fs[0].text == "kill:rank=1:collective=3"
    assert faults.parse("") == [] and faults.parse(" ; ") == []


@pytest.mark.parametrize("spec, bad, why", [
    ("explode:rank=1:collective=1", "explode:rank=1:collective=1", "unknown action 'explode'"),
    ("kill:rank=1:collective=1:colour=red", "kill:rank=1:collective=1:colour=red", "unknown key 'colour' for kill"),
    ("kill:collective=1", "kill:collective=1", "missing key 'rank'"),
    ("kill:rank=1", "kill:rank=1", "missing key 'collective' or 'p2p'"),
    ("delay:rank=1:collective=2", "delay:rank=1:collective=2", "missing key 'ms'"),
    ("fail:rank=1:collective=2", "fail:rank=1:collective=2", "missing key 'code'"),
    ("oom:card=0", "oom:card=0", "missing key 'malloc'"),
    ("kill:rank=one:collective=1", "kill:rank=one:collective=1", "rank='one' is not a number"),
    ("kill:rank=1:collective=0", "kill:rank=1:collective=0", "collective='0' is not a number in 1..2147483647"),
    ("delay:rank=1:collective=1:ms=1.5", "delay:rank=1:collective=1:ms=1.5", "ms='1.5' is not a number"),
    ("kill:rank=-1:collective=1", "kill:rank=-1:collective=1", "rank='-1' is not a number"),
    ("fail:rank=1:collective=1:code=HCCL_E_BOGUS", "fail:rank=1:collective=1:code=HCCL_E_BOGUS",
     "code='HCCL_E_BOGUS' is not an HcclResult failure code"),
    ("fail:rank=1:collective=1:code=0", "fail:rank=1:collective=1:code=0", "code='0' is not an HcclResult"),
    ("kill:rank=1:collective=1:p2p=2", "kill:rank=1:collective=1:p2p=2", "give one of collective= and p2p="),
    ("kill:rank=1:rank=2:collective=1", "kill:rank=1:rank=2:collective=1", "key 'rank' is given twice"),
    ("kill:rank:collective=1", "kill:rank:collective=1", "'rank' is not key=value"),
    ("ecc:card=0:malloc=1", "ecc:card=0:malloc=1", "unknown key 'malloc' for ecc"),
    ("kill:rank=1:collective=1;hang:rank=x:collective=1", "hang:rank=x:collective=1", "rank='x'"),
])
def test_a_malformed_spec_is_refused_naming_the_bad_part(spec, bad, why):
    with pytest.raises(rt.NpuError) as info:
        faults.parse(spec)
    assert info.value.code == rt.ACL_ERROR_INVALID_PARAM == 100000
    assert f"bad fault {bad!r}" in info.value.message and why in info.value.message, info.value.message
    assert info.value.message.startswith("NPUSIM_FAULTS: ")


# ------------------------------------------------------------------------------------------------ environment
def test_the_environment_is_read_at_init_and_a_malformed_spec_fails_there(rt_factory, monkeypatch):
    monkeypatch.setenv("NPUSIM_FAULTS", "oom:card=0:malloc=1;kill:rank=1:colective=2")
    with pytest.raises(rt.NpuError) as info:
        rt_factory()
    assert info.value.code == 100000 and "'kill:rank=1:colective=2': unknown key 'colective'" in info.value.message
    assert not rt.is_initialized()
    monkeypatch.setenv("NPUSIM_FAULTS", "oom:card=0:malloc=2")      # set after import: still seen
    rt_factory()
    rt.set_device(0)
    rt.malloc(64)
    with pytest.raises(rt.AclError, match=r"injected by NPUSIM_FAULTS: oom:card=0:malloc=2\)$"):
        rt.malloc(64)
    rt.malloc(64)                                                      # one fault, one failure


def test_without_faults_every_hook_is_one_false_check(rt_local, monkeypatch):
    rt_local.set_device(0)
    rt_local.free(rt_local.malloc(64))
    assert FAULTS.configured and FAULTS.armed is False
    assert faults.active() == []


# ------------------------------------------------------------------------------------------------ fail
_TASK = r"task hccl_collective#\d+ on stream \d+ of card {card} \(node 0\) failed: all_reduce #{seq} on comm '[^']+' " \
        r"\(rank {rank}\): "


def test_fail_surfaces_at_the_synchronize_as_a_genuine_timeout_does(rt_local, monkeypatch):
    # genuine: rank 1 never calls all_reduce #1; rank 0's synchronize reports the timeout
    c0, c1 = _two_ranks(rt_local, monkeypatch, timeout="1")
    t0 = _ones(c0)
    c0.all_reduce(t0)
    genuine = _sync(c0)
    assert isinstance(genuine, hccl.HcclError) and genuine.code == 9
    assert re.match(_TASK.format(card=0, seq=1, rank=0) + "EI0002 timed out", genuine.message), genuine.message
    # injected: both call it, rank 0's fails with the same code and the same shape (its peer completes)
    c0, c1 = _two_ranks(rt_local, monkeypatch)
    t0, t1 = _ones(c0), _ones(c1)
    with faults.inject("fail:rank=0:collective=1:code=HCCL_E_TIMEOUT"):
        c0.all_reduce(t0)
        c1.all_reduce(t1)
        err, ok = _sync(c0), _sync(c1)
    assert ok is None and t1.numpy().tolist() == [2.0] * 16
    assert type(err) is type(genuine) and err.code == genuine.code
    assert re.match(_TASK.format(card=0, seq=1, rank=0) + r"EI0002 HCCL_E_TIMEOUT: timeout \(injected by "
                    r"rt\.faults\.inject: fail:rank=0:collective=1:code=HCCL_E_TIMEOUT\)$", err.message), err.message
    assert rt.get_recent_err_msg().startswith(err.message.split(" (injected")[0])


def test_fail_takes_the_kth_collective_over_all_communicators_and_a_numeric_code(rt_local, monkeypatch):
    c0, c1 = _two_ranks(rt_local, monkeypatch)
    subs = _two_ranks(rt_local, monkeypatch)                   # a second communicator of the same two ranks
    t0, t1 = _ones(c0), _ones(c1)
    with faults.inject("fail:rank=1:collective=3:code=15"):
        for comm, sub, t in ((c0, subs[0], t0), (c1, subs[1], t1)):
            rt.set_device(comm.device)
            comm.all_reduce(t)                 # rank 1's collective #1
            sub.all_reduce(t)                  # #2 (on the sub communicator)
            sub.barrier()                      # #3: this one fails
        err = _sync(c1)
    assert _sync(c0) is None and err.code == 15
    assert "barrier #2 on comm" in err.message and "(rank 1): HCCL_E_RUNTIME: call runtime api fail (injected" \
        in err.message, err.message


def test_fail_on_a_recv_has_the_shape_of_a_genuine_recv_timeout(rt_local, monkeypatch):
    import hccl
    c0, c1 = _two_ranks(rt_local, monkeypatch, timeout="1")
    shape = r"task hccl_p2p#\d+ on stream \d+ of card 1 \(node 0\) failed: recv #1 on rank 1 from rank 0 on " \
            r"comm '[^']+': EI0002 "
    t1 = _ones(c1)
    hccl.recv(t1.ptr, 16, hccl.HCCL_DATA_TYPE_FP32, 0, c1)           # nobody sends
    genuine = _sync(c1)
    assert genuine.code == 9 and re.match(shape + "rank 0 never sent", genuine.message), genuine.message
    c0, c1 = _two_ranks(rt_local, monkeypatch)
    t0, t1 = _ones(c0), _ones(c1, value=0.0)
    with faults.inject("fail:rank=1:p2p=1:code=HCCL_E_TIMEOUT"):
        rt.set_device(0)
        hccl.send(t0.ptr, 16, hccl.HCCL_DATA_TYPE_FP32, 1, c0)
        rt.set_device(1)
        hccl.recv(t1.ptr, 16, hccl.HCCL_DATA_TYPE_FP32, 0, c1)
        err = _sync(c1)
    assert _sync(c0) is None and err.code == genuine.code
    assert re.match(shape + r"HCCL_E_TIMEOUT: timeout \(injected by rt\.faults\.inject: fail:rank=1:p2p=1:code="
                            r"HCCL_E_TIMEOUT\)$", err.message), err.message
    assert t1.numpy().tolist() == [1.0] * 16                           # the transfer itself happened


def test_collective_counting_leaves_send_and_recv_out(rt_local, monkeypatch):
    import hccl
    c0, c1 = _two_ranks(rt_local, monkeypatch)
    t0, t1 = _ones(c0), _ones(c1)
    with faults.inject("fail:rank=1:collective=1:code=HCCL_E_INTERNAL"):
        rt.set_device(0)
        hccl.send(t0.ptr, 16, hccl.HCCL_DATA_TYPE_FP32, 1, c0)
        rt.set_device(1)
        hccl.recv(t1.ptr, 16, hccl.HCCL_DATA_TYPE_FP32, 0, c1)          # p2p: not a collective
        assert _sync(c1) is None
        c0.all_reduce(t0)
        c1.all_reduce(t1)                                                 # rank 1's collective #1
        err = _sync(c1)
    assert err.code == 4 and "all_reduce #1" in err.message


# ------------------------------------------------------------------------------------------------ corrupt, delay
@pytest.mark.parametrize("n", [16, 1 << 17])           # the staged path, and a schedule (512 KiB per rank)
def test_corrupt_inverts_what_that_rank_receives_and_nothing_else(rt_local, monkeypatch, capfd, n):
    c0, c1 = _two_ranks(rt_local, monkeypatch)
    t0, t1 = _ones(c0, n), _ones(c1, n)
    with faults.inject("corrupt:rank=0:collective=2"):
        for _ in range(2):
            c0.all_reduce(t0)
            c1.all_reduce(t1)
        assert _sync(c0) is None and _sync(c1) is None           # no error: corruption is silent
    expected = np.full(n, 4.0, np.float32)
    assert np.array_equal(t1.numpy(), expected)
    assert np.array_equal(t0.numpy().view(np.uint32), ~expected.view(np.uint32))
    err = capfd.readouterr().err
    assert "npusim: rank 0 will receive inverted bytes from all_reduce #2" in err
    assert "(injected by rt.faults.inject: corrupt:rank=0:collective=2)" in err


def test_corrupt_bytes_limits_it_and_broadcast_receivers_are_hit(rt_local, monkeypatch):
    import hccl
    c0, c1 = _two_ranks(rt_local, monkeypatch)
    t0, t1 = _ones(c0), _ones(c1, value=0.0)
    with faults.inject("corrupt:rank=1:collective=1:bytes=4"):
        rt.set_device(0)
        hccl.broadcast(t0.ptr, 16, hccl.HCCL_DATA_TYPE_FP32, 0, c0)
        rt.set_device(1)
        hccl.broadcast(t1.ptr, 16, hccl.HCCL_DATA_TYPE_FP32, 0, c1)
        assert _sync(c0) is None and _sync(c1) is None
    got = t1.numpy()
    assert got[0] == np.uint32(~np.float32(1.0).view(np.uint32)).view(np.float32) and got[1:].tolist() == [1.0] * 15
    assert t0.numpy().tolist() == [1.0] * 16


def test_delay_holds_that_rank_back_and_changes_nothing_else(rt_local, monkeypatch, capfd):
    c0, c1 = _two_ranks(rt_local, monkeypatch)
    t0, t1 = _ones(c0), _ones(c1)
    with faults.inject("delay:rank=1:collective=2:ms=400"):
        times = []
        for _ in range(2):
            start = time.monotonic()
            c0.all_reduce(t0)
            c1.all_reduce(t1)
            assert _sync(c0) is None and _sync(c1) is None
            times.append(time.monotonic() - start)
    assert times[1] >= 0.4
    assert t0.numpy().tolist() == t1.numpy().tolist() == [4.0] * 16
    err = capfd.readouterr().err
    assert err.count("npusim: rank 1 waits 400 ms as it enters all_reduce #2") == 1 and "waits 400 ms" in err


# ------------------------------------------------------------------------------------------------ oom
_OOM = (r"EL0004: Failed to allocate memory\. malloc: out of memory on card 0 \(node 0\): requested (\d+) bytes "
        r"\(rounded (\d+)\); allocated (\d+), reserved (\d+) \(cached (\d+)\), capacity (\d+)")


def test_oom_is_the_error_of_a_full_card(rt_factory, small_config):
    rt_factory(small_config)
    rt.set_device(0)
    held = [rt.malloc(1 << 20) for _ in range(3)]
    with faults.inject("oom:card=0:malloc=2"):
        rt.malloc(1000)                                            # the 1st
        with pytest.raises(rt.AclError) as injected:
            rt.malloc(1000)                                        # the 2nd fails
        after = rt.malloc(1000)                                    # and the fault is spent
    stats = rt.memory_stats()
    with pytest.raises(rt.AclError) as genuine:                    # a genuinely full card
        while True:
            held.append(rt.malloc(1 << 20))
    assert injected.value.code == genuine.value.code == rt.ACL_ERROR_RT_MEMORY_ALLOCATION == 207001
    assert re.fullmatch(_OOM, genuine.value.message), genuine.value.message
    m = re.fullmatch(_OOM + r" \(injected by rt\.faults\.inject: oom:card=0:malloc=2\)", injected.value.message)
    assert m, injected.value.message
    assert int(m[1]) == 1000 and int(m[2]) == 1056 and int(m[6]) == 8 << 20
    assert int(m[3]) <= stats["allocated_bytes.all.current"] and int(m[4]) <= stats["reserved_bytes.all.current"]
    assert rt.get_recent_err_msg().startswith(genuine.value.message)
    for p in held + [after]:
        rt.free(p)


def test_oom_counts_mallocs_on_its_card_only_and_tensors_too(rt_local):
    with faults.inject("oom:card=1:malloc=2"):
        rt.set_device(0)
        for _ in range(3):
            rt.malloc(64)
        rt.set_device(1)
        rt.empty((4,))                                             # a tensor's allocation is a malloc
        with pytest.raises(rt.AclError, match="out of memory on card 1 .*malloc=2"):
            rt.malloc(64)


def test_oom_through_the_acl_facade_returns_207001():
    import acl
    rt.init(backend="local")
    try:
        acl.rt.set_device(0)
        with faults.inject("oom:card=0:malloc=1"):
            ptr, ret = acl.rt.malloc(64, 0)
        assert ret == 207001 and ptr == 0
        assert "EL0004" in acl.get_recent_err_msg()
    finally:
        rt.finalize()


# ------------------------------------------------------------------------------------------------ ecc
def test_ecc_fails_the_next_synchronize_on_that_card_with_507054(rt_local):
    rt.set_device(1)
    s = rt.create_stream()
    rt.set_device(0)
    with faults.inject("ecc:card=1"):
        rt.synchronize_device()                                    # card 0: untouched
        rt.set_device(1)
        with pytest.raises(rt.AclError) as info:
            rt.synchronize_stream(s)
        rt.synchronize_stream(s)                                   # one error
    e = info.value
    assert e.code == rt.ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR == 507054
    assert e.message.startswith("synchronize_stream: EZ9999: Inner Error! The error from device (card 1, node 0)")
    assert "reason=[hbm Multi-bit ECC error]" in e.message
    assert e.message.endswith("(injected by rt.faults.inject: ecc:card=1)")


def test_ecc_sync_counts_every_kind_of_synchronize(rt_local):
    rt.set_device(0)
    ev = rt.create_event()
    s = rt.create_stream()
    with faults.inject("ecc:card=0:sync=4"):
        rt.synchronize_device()
        rt.record_event(ev, s)
        rt.synchronize_event(ev)
        rt.synchronize_stream_with_timeout(s, 1000)
        with pytest.raises(rt.AclError, match=r"^\[507054\] synchronize_event: EZ9999"):
            rt.synchronize_event(ev)


# ------------------------------------------------------------------------------------------------ restart, rank
def test_a_fault_applies_only_in_its_restart(rt_local, monkeypatch):
    rt.set_device(0)
    with faults.inject("oom:card=0:malloc=1:restart=1"):
        rt.free(rt.malloc(64))                                    # RESTART_COUNT unset: restart 0
    monkeypatch.setenv("RESTART_COUNT", "1")
    with faults.inject("oom:card=0:malloc=1:restart=1;oom:card=0:malloc=2"):
        assert faults.active() == ["oom:card=0:malloc=1:restart=1"]
        with pytest.raises(rt.AclError, match="restart=1"):
            rt.malloc(64)
        rt.free(rt.malloc(64))                                    # the restart-0 fault is not in effect


def test_with_rank_set_a_rank_fault_counts_every_collective_of_this_process(rt_local, monkeypatch):
    c0, c1 = _two_ranks(rt_local, monkeypatch)
    t0, t1 = _ones(c0), _ones(c1)
    monkeypatch.setenv("RANK", "1")                   # as under launch: this process is rank 1
    with faults.inject("fail:rank=1:collective=2:code=HCCL_E_INTERNAL;fail:rank=0:collective=1:code=HCCL_E_PARA"):
        c0.all_reduce(t0)                             # this process's collective #1 (rank 0's fault: not ours)
        c1.all_reduce(t1)                             # #2: fails, although it is rank 1's first on its comm
        assert _sync(c0) is None
        err = _sync(c1)
    assert err.code == 4 and "(rank 1)" in err.message


def test_inject_as_a_context_restores_what_was_in_effect(rt_local):
    rt.set_device(0)
    outer = faults.inject("oom:card=0:malloc=3")
    with faults.inject("ecc:card=0"):
        assert faults.active() == ["ecc:card=0"]
    assert faults.active() == ["oom:card=0:malloc=3"]
    with outer:
        pass
    assert faults.active() == []
    with pytest.raises(rt.NpuError, match="rt.faults.inject: bad fault 'oom:card=0'"):
        faults.inject("oom:card=0")
