"""The node protocol's pieces the host path's lean call relies on (hccl/protocol/), without cards or Ray.

A control block here is a plain numpy array, as every card and rank process maps it: the one-call
reduction over every rank's stage must give the bits the rank-by-rank combination gives (ranks on the
card path and on the host path compute the same result independently); a barrier phase wakes its
sleepers once, when it completes; a rank that knows its own call sees disagreement as the full
fingerprint comparison does.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hccl.protocol import ctrlblock, futex, staged
from hccl.protocol.ctrlblock import R_SLEEPING, ROUND, SLEEPING, ControlBlock
from hccl.types import HcclDataType, HcclReduceOp


def block(n: int) -> ControlBlock:
    return ControlBlock(np.zeros(ControlBlock.nbytes(n), np.uint8), n)


def fill_stages(ctrl: ControlBlock, parity: int, inputs: list) -> None:
    for k, x in enumerate(inputs):
        raw = x.view(np.uint8)
        ctrl.stage(k, parity)[:raw.size] = raw


CODES = {np.float32: HcclDataType.FP32, np.float16: HcclDataType.FP16, np.int8: HcclDataType.INT8,
         np.int32: HcclDataType.INT32, np.float64: HcclDataType.FP64}


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.int32, np.float64])
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "reduce"])
@pytest.mark.parametrize("rop", list(HcclReduceOp)[:4])
def test_one_call_reduction_gives_the_bits_of_the_rank_by_rank_one(dtype, op, rop):
    rng = np.random.default_rng(7)
    n, count = 5, 37
    per_rank = count * n if op == "reduce_scatter" else count
    ctrl = block(n)
    p = {"count": count, "dtype": int(CODES[dtype]), "op": int(rop), "root": 0 if op == "reduce" else None}
    for parity in (0, 1):
        if np.dtype(dtype).kind == "f":
            inputs = [(rng.standard_normal(per_rank) * 3).astype(dtype) for _ in range(n)]
        else:
            inputs = [rng.integers(-9, 9, per_rank).astype(dtype) for _ in range(n)]
        fill_stages(ctrl, parity, inputs)
        for rank in (0, 3):
            fast = staged.fast_reduce(ctrl, rank, op, p)
            assert fast is not None
            want, got = np.zeros(count, dtype), np.zeros(count, dtype)
            staged.stage_out(ctrl, rank, 2 + parity, op, p, want.view(np.uint8))
            fast(parity, got.view(np.uint8))
            assert got.tobytes() == want.tobytes(), (parity, rank)
            first = rank * count if op == "reduce_scatter" else 0
            if rop == HcclReduceOp.SUM and np.dtype(dtype).kind == "f":          # and it is the reduction
                oracle = np.sum([x[first: first + count].astype(np.float64) for x in inputs], axis=0)
                np.testing.assert_allclose(got.astype(np.float64), oracle, rtol=1e-2 if dtype is np.float16 else 1e-5,
                                           atol=1e-2 if dtype is np.float16 else 1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("rop", list(HcclReduceOp)[:4])
def test_a_split_all_reduce_gives_every_rank_the_bits_of_the_one_phase_reduction(dtype, rop):
    """Phase 1 on every rank (its block, into its result and its stage), then phase 2 (the others' blocks): each
    rank's result equals what stage_out computes in one phase — fast (one ufunc call) and rank-by-rank alike."""
    rng = np.random.default_rng(3)
    n, itemsize = 5, np.dtype(dtype).itemsize
    count = staged.SPLIT_BYTES // itemsize + 3                  # blocks of unequal sizes
    code = HcclDataType.BFP16 if dtype is ml_dtypes.bfloat16 else CODES[dtype]
    p = {"count": count, "dtype": int(code), "op": int(rop)}
    assert staged.split_reduce("all_reduce", p, n) and not staged.split_reduce("all_reduce", dict(p, count=8), n)
    assert not staged.split_reduce("reduce", p, n)
    assert sum(staged.block(count, n, r)[1] for r in range(n)) == count
    for fast in (False, True):
        ctrl = block(n)
        parity = 1
        inputs = [rng.integers(-9, 9, count).astype(dtype) if dtype is np.int32 else
                  (rng.standard_normal(count) * 3).astype(dtype) for _ in range(n)]
        fill_stages(ctrl, parity, inputs)
        want = np.zeros(count, dtype)
        staged.stage_out(ctrl, 0, 2 + parity, "all_reduce", p, want.view(np.uint8))
        outs = [np.zeros(count, dtype) for _ in range(n)]
        steps = [staged.fast_split(ctrl, r, p) for r in range(n)] if fast else None
        if fast and steps[0] is None:                           # bfloat16: the rank-by-rank functions only
            continue
        for r in range(n):
            if fast:
                steps[r][0](parity, outs[r].view(np.uint8))
            else:
                staged.split_own(lambda k: ctrl.stage(k, parity), n, r, p, outs[r].view(np.uint8))
        for r in range(n):
            if fast:
                steps[r][1](parity, outs[r].view(np.uint8))
            else:
                staged.split_gather(lambda k: ctrl.stage(k, parity), n, r, p, outs[r].view(np.uint8))
        for r in range(n):
            assert outs[r].tobytes() == want.tobytes(), (fast, r)


def test_one_call_reduction_is_only_for_numpy_number_reductions():
    ctrl = block(4)
    assert staged.fast_reduce(ctrl, 0, "all_gather", {"count": 4, "dtype": int(HcclDataType.FP32)}) is None
    assert staged.fast_reduce(ctrl, 0, "broadcast", {"count": 4, "dtype": int(HcclDataType.FP32), "root": 0}) is None
    bf16 = {"count": 4, "dtype": int(HcclDataType.BFP16), "op": 0}
    assert np.dtype(ml_dtypes.bfloat16).itemsize == 2
    assert staged.fast_reduce(ctrl, 0, "all_reduce", bf16) is None      # ml_dtypes: the rank-by-rank path


def test_a_phase_wakes_its_sleepers_once_when_the_last_rank_arrives(monkeypatch):
    wakes = []
    monkeypatch.setattr(futex, "wake", lambda address, count=1 << 30: wakes.append(address))
    ctrl = block(4)
    ctrl.slots[:, SLEEPING] = 1                         # everybody else asleep on the block
    targets = [ctrl.arrive(r) for r in (2, 0, 3)]
    assert targets == [1, 1, 1] and wakes == []          # incomplete phase: no system call
    assert ctrl.arrive(1) == 1 and wakes == [ctrl.wake_addr]
    assert ctrl.arrive(0) == 2 and len(wakes) == 1       # rank 0 alone in phase 2
    # a barrier among the ranks of one node (0 and 2) completes without ranks 1 and 3
    assert ctrl.arrive(2, [0, 2]) == 2 and len(wakes) == 2
    ctrl.slots[:, SLEEPING] = 0
    for r in (1, 3, 0, 1, 2, 3):
        ctrl.arrive(r)
    assert len(wakes) == 2                               # nobody asleep: never a system call


def test_the_result_word_and_the_block_word_wake_only_their_own_sleepers(monkeypatch):
    wakes = []
    monkeypatch.setattr(futex, "wake", lambda address, count=1 << 30: wakes.append(address))
    ctrl = block(4)
    ctrl.slots[1:, R_SLEEPING] = 1                      # ranks 1-3 wait for their leader's result
    ctrl.notify()
    assert wakes == []                                   # nobody sleeps on the block's word: no system call
    ctrl.notify_result()
    assert wakes == [ctrl.result_addr]
    ctrl.slots[:, R_SLEEPING] = 0
    ctrl.notify_result()
    assert len(wakes) == 1
    ctrl.slots[2, SLEEPING] = 1
    ctrl.notify()
    ctrl.notify_result()
    assert wakes == [ctrl.result_addr, ctrl.wake_addr]


def test_an_arrival_among_consecutive_local_ranks_checks_their_phase_slice(monkeypatch):
    wakes = []
    monkeypatch.setattr(futex, "wake", lambda address, count=1 << 30: wakes.append(address))
    ctrl = block(6)
    ctrl.slots[:, SLEEPING] = 1
    local, phases = [2, 3, 4], ctrl.phase_words[2:5]
    assert [ctrl.arrive(r, local, round_=True, phases=phases) for r in (4, 2)] == [1, 1] and wakes == []
    assert ctrl.arrive(3, local, round_=True, phases=phases) == 1 and wakes == [ctrl.wake_addr]
    assert [int(ctrl.slots[r, ROUND]) for r in range(6)] == [0, 0, 1, 1, 1, 0]
    # the same arrivals through the list of local ranks give the same phases and wake-ups
    other = block(6)
    other.slots[:, SLEEPING] = 1
    assert [other.arrive(r, local, round_=True) for r in (4, 2, 3)] == [1, 1, 1] and len(wakes) == 2


class _Clock:
    """A fake clock for ``Spinner``: each yield advances it by the next of ``steps`` seconds."""

    def __init__(self, steps):
        self.now, self.steps, self.yields = 100.0, list(steps), 0

    def __call__(self):
        return self.now

    def yield_(self):
        self.yields += 1
        self.now += self.steps.pop(0) if self.steps else 1e-6


def test_a_waiter_yields_while_yields_return_quickly_then_sleeps():
    clock = _Clock([5e-6] * 3)
    spinner = ctrlblock.Spinner(clock, clock.yield_)
    met = iter([False, False, False, True])
    assert spinner.spin(lambda: next(met)) is True and clock.yields == 3     # met while yielding
    clock = _Clock([5e-6, 150e-6])                                          # the core went elsewhere: sleep
    spinner = ctrlblock.Spinner(clock, clock.yield_)
    assert spinner.spin(lambda: False) is False and clock.yields == 2 and spinner.skip == 0
    clock = _Clock([])                                                      # never met: at most SPIN_SECONDS
    spinner = ctrlblock.Spinner(clock, clock.yield_)
    assert spinner.spin(lambda: False) is False
    assert clock.yields == int(ctrlblock.SPIN_SECONDS / 1e-6) + 1


def test_the_phase_wait_spins_as_the_generic_one_does():
    """``spin_phase(phases, target)`` is ``spin(lambda: min(phases) >= target)`` written out: the same yields, the
    same answer and the same penalty for a long yield."""
    for steps, arrive_after in (([5e-6] * 3, 3), ([5e-6, 150e-6], None), ([], None), ([3e-3], None)):
        runs = []
        for phased in (False, True):
            clock = _Clock(list(steps))
            spinner = ctrlblock.Spinner(clock, clock.yield_)
            phases = [4, 5, 5]

            def yield_(clock=clock, phases=phases):
                clock.yield_()
                if arrive_after is not None and clock.yields >= arrive_after:
                    phases[0] = 5
            spinner.yield_ = yield_
            got = spinner.spin_phase(phases, 5) if phased else spinner.spin(lambda: min(phases) >= 5)
            runs.append((got, clock.yields, spinner.skip, spinner.penalty))
        assert runs[0] == runs[1], runs
    assert ctrlblock.Spinner().spin_phase([7, 9], 7) is True           # complete already: no yield at all


def test_a_yield_that_loses_the_core_for_long_stops_yielding_for_a_growing_number_of_waits():
    clock = _Clock([])
    spinner = ctrlblock.Spinner(clock, clock.yield_)

    def waits_sleeping_at_once():
        n = 0
        while True:
            before = clock.yields
            clock.steps = [1e-6]
            spinner.spin(lambda: False)
            if clock.yields > before:
                return n
            n += 1
    for expected in (8, 16, 32):
        clock.steps = [3e-3]                    # another process held the core for 3 ms
        assert spinner.spin(lambda: False) is False
        assert waits_sleeping_at_once() == expected
    clock.now += 10.0                           # no long yield for a while: back to the shortest pause
    clock.steps = [3e-3]
    spinner.spin(lambda: False)
    assert waits_sleeping_at_once() == 8
    for _ in range(20):
        clock.steps = [3e-3]
        spinner.spin(lambda: False)
        spinner.skip = 0
    assert spinner.penalty == ctrlblock.Spinner.MAX_SKIP


def test_a_rank_that_knows_its_call_sees_a_mismatch_as_the_full_comparison_does():
    n = 4
    ctrl = block(n)
    text = "all_reduce(count=256, dtype=FP32, op=SUM)"
    for seq in (1, 2, 3):
        parity = seq % 2
        for r in range(n):
            ctrl.set_fingerprint(r, seq, text.replace("256", "255") if (seq == 2 and r == 3) else text)
        area, data = ctrl.fingerprint_record(1, parity, text)
        assert area.tobytes() == data.tobytes()           # what set_fingerprint wrote for rank 1
        agreed = ctrl.fingerprint_areas(parity, data.size).tobytes() == data.tobytes() * n
        assert agreed == ctrl.fingerprints_equal(seq) == (seq != 2)
    ctrl.set_fingerprint(2, 5, text + ", root=0")         # longer: its length byte differs
    for r in (0, 1, 3):
        ctrl.set_fingerprint(r, 5, text)
    _, data = ctrl.fingerprint_record(0, 1, text)
    assert ctrl.fingerprint_areas(1, data.size).tobytes() != data.tobytes() * n
    assert not ctrl.fingerprints_equal(5)
