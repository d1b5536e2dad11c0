"""The shared control block of one communicator on one node, and waiting on it.

Each communicator has one *control block* per node: a shared-memory array with one slot per rank
(phase counter for barriers, arrived/completed sequence numbers, the fingerprint of the call, where
its buffers live), one mailbox per ordered rank pair for send/recv, a futex word, and per rank two
staging areas for small collectives (``hccl/protocol/staged.py``) and, for small collectives across
nodes, two result areas written by the node's leader (``hccl/protocol/nodestaged.py``). Rank 0's card of the node creates it on
first request; the other cards — and rank processes using the host path — map it from a file
descriptor. Waiting on it yields the core a few times first (``Spinner``: the peers waited for often run
meanwhile, which saves a futex sleep and wake-up), then sleeps on the futex (``wait_until``); a barrier phase
wakes its sleepers once, when its last rank arrives (``arrive``).
"""

from __future__ import annotations

import os
import time

import numpy as np

from . import futex

# slot layout (int64 words)
PHASE, ARRIVED, DONE, STATUS, PID, CARD, R_SLEEPING, SLEEPING = range(8)   # SLEEPING: on wake_word; R_: result_word
ROUND = 8                      # the barrier phase this rank's last arrival at a round across nodes reached
BUF0 = 9                       # send seg, off, size; recv seg, off, size; tmp seg, off, size
# in a node leader's slot, per sequence parity p at word + 3p: the node's result of a collective across nodes
# (``nodestaged.py``): its sequence number, kind (0 data, 1 failure, 2 calls that disagree) << 32 | HcclResult
# code, bytes in the result area
R_SEQ, R_INFO, R_LEN = 18, 19, 20
SLOT_WORDS = 64                # 512 bytes: words + fingerprint text
FP_OFF = 24 * 8
FP_MAX = (SLOT_WORDS * 8 - FP_OFF) // 2        # two fingerprints per slot, by sequence parity
STAGE_BYTES = 256 << 10                        # per rank and parity: small collectives go through here
RESULT_BYTES = 1 << 20                         # per parity: a node's result of a small collective across nodes
# pair mailbox layout (int64 words)
P_SEND, P_RECV_DONE, P_SEG, P_OFF, P_SIZE, P_COUNT, P_DTYPE, V_SCOUNT, V_SDISPL, V_RCOUNT = range(10)
PAIR_WORDS = 10
ALIVE, HOST_GONE, CLOSED = 0, 1, 2
SPIN_SECONDS = 300e-6          # a waiter yields for at most this long before it sleeps
SHORT_YIELD = 100e-6           # a yield that took longer: the core went to other work meanwhile, so sleep now
LONG_YIELD = 2e-3              # ... longer still: something else holds the cores, stop yielding for a while
CALM_SECONDS = 1.0             # ... after this long without such a yield, the pause starts short again


GAVE_UP = "!"                   # a fingerprint that starts so: the rank timed out on that collective (give_up)


def gave_up(fps: list[str]) -> str | None:
    """The error text for a collective some rank gave up on before the others arrived (None: none did)."""
    who = [(r, fp[len(GAVE_UP):]) for r, fp in enumerate(fps) if fp.startswith(GAVE_UP)]
    if not who:
        return None
    return ("EI0002 " + "; ".join(f"rank {r} {text}" for r, text in who) + " — before this rank arrived: the ranks "
            "are out of step (destroy the communicator and create it again)")


class WaitAbort(Exception):
    pass


class ControlBlock:
    """The shared control array of one communicator (mapped by every card of the node)."""

    def __init__(self, arr: np.ndarray, nranks: int):
        self.n = nranks
        words = arr.view(np.int64)
        self.slots = words[: nranks * SLOT_WORDS].reshape(nranks, SLOT_WORDS)
        end = nranks * SLOT_WORDS + nranks * nranks * PAIR_WORDS
        self.pairs = words[nranks * SLOT_WORDS: end].reshape(nranks, nranks, PAIR_WORDS)
        self.wake_word = arr[8 * end: 8 * end + 4].view(np.int32)     # futex word
        self.wake_addr = futex.pointer(self.wake_word.ctypes.data)
        # Across nodes (``nodestaged.py``): the futex word the node's ranks sleep on while they wait for their
        # leader's result (only its publication wakes them, not the node's arrivals), and whether the host
        # thread that leads the node's rounds sleeps on ``wake_word`` (``hccl/transport/leaders.py``).
        self.result_word = arr[8 * end + 8: 8 * end + 12].view(np.int32)
        self.result_addr = futex.pointer(self.result_word.ctypes.data)
        self.result_value = memoryview(self.result_word).cast("B").cast("i")     # its int32, read without numpy
        self.lead_sleeping = arr[8 * end + 16: 8 * end + 24].view(np.int64)
        self.stage_base = 8 * end + 64
        results = self.stage_base + 2 * nranks * STAGE_BYTES
        self.results = [arr[results + p * RESULT_BYTES: results + (p + 1) * RESULT_BYTES] for p in (0, 1)]
        self.raw = arr
        self.phases = self.slots[:, PHASE]
        # The hot words again as memoryviews: an element read or a min over 8 ranks costs a tenth of numpy's
        # per-call overhead (slot word i of rank r is words[r * SLOT_WORDS + i]).
        self.words = memoryview(arr[: 8 * end]).cast("B").cast("q")
        self.phase_words = self.words[PHASE: nranks * SLOT_WORDS: SLOT_WORDS]
        self.sleep_words = self.words[SLEEPING: nranks * SLOT_WORDS: SLOT_WORDS]
        self.result_sleep_words = self.words[R_SLEEPING: nranks * SLOT_WORDS: SLOT_WORDS]

    @staticmethod
    def nbytes(nranks: int) -> int:
        return 8 * (nranks * SLOT_WORDS + nranks * nranks * PAIR_WORDS) + 64 + nranks * 2 * STAGE_BYTES \
            + 2 * RESULT_BYTES

    def stage(self, rank: int, parity: int) -> np.ndarray:
        """Rank's staging area for collectives of this sequence parity (uint8, STAGE_BYTES)."""
        base = self.stage_base + (2 * rank + parity) * STAGE_BYTES
        return self.raw[base: base + STAGE_BYTES]

    def result(self, parity: int) -> np.ndarray:
        """The node's result area for collectives of this sequence parity across nodes (uint8, RESULT_BYTES):
        written by the node's leader, read by its other ranks (``nodestaged.py``); its pages cost memory
        only once written."""
        return self.results[parity]

    def notify(self) -> None:
        """State changed: wake the ranks that sleep on this block (no system call if none does)."""
        if any(self.sleep_words) or self.lead_sleeping[0]:
            self.wake_word[0] += 1
            futex.wake(self.wake_addr)

    def notify_result(self) -> None:
        """The node's leader published a round's result: wake the ranks sleeping in :meth:`sleep_result`. (They
        flag themselves apart from the block's other sleepers, so neither wake-up is a system call for nobody.)"""
        if any(self.result_sleep_words):
            self.result_word[0] += 1
            futex.wake(self.result_addr)

    def arrive(self, rank: int, local=None, round_: bool = False, phases=None) -> int:
        """``rank`` reaches the next barrier phase (of all ranks, or of the ranks ``local`` on its node — whose
        phase words are ``phases``, a slice of :attr:`phase_words`, when the caller keeps one); returns the phase to
        wait for. Only the arrival that completes the phase wakes the sleepers — one
        wake-up per phase, not one per rank: nobody waiting on a phase can proceed before it is complete.
        (The arrival's store and the check that follows are separated by far more stores than a store
        buffer holds, so two last arrivals cannot both miss each other; were a wake-up ever lost, the
        sleepers' bounded sleep recovers it.)"""
        words, at = self.words, rank * SLOT_WORDS + PHASE
        target = words[at] + 1
        words[at] = target
        if round_:          # an arrival at a round across nodes: the phase its leader publishes past
            words[at + ROUND] = target
        if phases is not None or local is None:
            if min(self.phase_words if phases is None else phases) >= target:
                self.notify()
        elif min(self.phase_words[r] for r in local) >= target:
            self.notify()
        return target

    def sleep(self, rank: int, cond, timeout: float) -> None:
        """Sleep until woken (or ``timeout``), unless ``cond()`` already holds."""
        at = rank * SLOT_WORDS + SLEEPING
        self.words[at] = 1
        seen = int(self.wake_word[0])
        try:
            if not cond():
                futex.wait(self.wake_addr, seen, timeout)
        finally:
            self.words[at] = 0

    def sleep_result(self, rank: int, at: int, value: int, timeout: float) -> None:
        """Sleep until woken (or ``timeout``) on the word only the leader's publication of a result bumps, unless
        word ``at`` is above ``value`` already."""
        words, flag = self.words, rank * SLOT_WORDS + R_SLEEPING
        words[flag] = 1
        seen = self.result_value[0]
        try:
            if words[at] <= value:
                futex.wait(self.result_addr, seen, timeout)
        finally:
            words[flag] = 0

    def lead_sleep(self, cond, timeout: float) -> None:
        """As :meth:`sleep`, for the host thread leading the node's rounds (it has no slot of its own)."""
        self.lead_sleeping[0] = 1
        seen = int(self.wake_word[0])
        try:
            if not cond():
                futex.wait(self.wake_addr, seen, timeout)
        finally:
            self.lead_sleeping[0] = 0

    def fingerprint(self, rank: int, seq: int) -> str:
        """What ``rank`` called as collective ``seq`` (kept for two sequence numbers: seq and seq-1)."""
        base = rank * SLOT_WORDS * 8 + FP_OFF + (seq % 2) * FP_MAX
        n = int(self.raw[base])
        return bytes(self.raw[base + 1: base + 1 + n]).decode("utf-8", "replace")

    def fingerprints_equal(self, seq: int, first: int = 0, count: int | None = None) -> bool:
        """Whether every rank's fingerprint for ``seq`` equals rank ``first``'s (length byte and text), of the
        ``count`` ranks from ``first`` on (all ranks by default)."""
        start = FP_OFF + (seq % 2) * FP_MAX
        end = self.n if count is None else first + count
        table = self.raw[first * SLOT_WORDS * 8: end * SLOT_WORDS * 8].reshape(end - first, SLOT_WORDS * 8)
        length = int(table[0, start])
        area = table[:, start: start + 1 + length]
        return bool((area == area[0]).all())

    def fingerprint_record(self, rank: int, parity: int, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Where ``rank``'s fingerprint for sequence numbers of ``parity`` goes, and the length-prefixed bytes
        :meth:`set_fingerprint` writes there: for callers that publish the same call again and again."""
        data = text.encode()[:FP_MAX - 1]
        base = rank * SLOT_WORDS * 8 + FP_OFF + parity * FP_MAX
        return self.raw[base: base + 1 + len(data)], np.frombuffer(bytes([len(data)]) + data, np.uint8)

    def fingerprint_areas(self, parity: int, length: int) -> np.ndarray:
        """Every rank's length-prefixed fingerprint area of ``length`` bytes for sequence numbers of ``parity``
        (an (n, length) view): compared with what :meth:`fingerprint_record` returns, as bytes, it is
        :meth:`fingerprints_equal` for a caller that knows its own call."""
        start = FP_OFF + parity * FP_MAX
        return self.raw[: self.n * SLOT_WORDS * 8].reshape(self.n, SLOT_WORDS * 8)[:, start: start + length]

    def fingerprint_setup(self, rank: int, text: str) -> tuple[list, np.ndarray, list, bytes]:
        """For a caller that publishes call ``text`` again and again: where ``rank``'s fingerprint goes and its
        bytes (:meth:`fingerprint_record`, per sequence parity), every rank's area of that length per parity
        (:meth:`fingerprint_areas`), and what those areas hold when every rank called ``text``."""
        areas, data = [], None
        for parity in (0, 1):
            area, data = self.fingerprint_record(rank, parity, text)
            areas.append(area)
        every = [self.fingerprint_areas(parity, data.size) for parity in (0, 1)]
        return areas, data, every, data.tobytes() * self.n

    def give_up(self, rank: int, seq: int, seconds: float) -> None:
        """``rank`` stopped waiting for collective ``seq`` (its HCCL_EXEC_TIMEOUT of ``seconds``): its fingerprint
        says so (``GAVE_UP`` first), so a rank that arrives later finds the calls disagree and is told why
        (:func:`gave_up`) instead of completing a collective its peer already failed."""
        self.set_fingerprint(rank, seq, f"{GAVE_UP}gave up on #{seq} after its {seconds:g} s HCCL_EXEC_TIMEOUT")

    def set_fingerprint(self, rank: int, seq: int, text: str) -> None:
        data = text.encode()[:FP_MAX - 1]
        base = rank * SLOT_WORDS * 8 + FP_OFF + (seq % 2) * FP_MAX
        self.raw[base + 1: base + 1 + len(data)] = np.frombuffer(data, np.uint8)
        self.raw[base] = len(data)


class Spinner:
    """Whether a waiter yields its core before it sleeps, and for how long (one per process).

    With 8 ranks on 2 cores the ranks waited for are usually runnable on the waiter's core: yielding lets
    them run at once, and the waiter often finds its condition met without a futex sleep and wake-up —
    which on a VM costs an inter-processor interrupt each (a bare 8-process barrier: ≈ 45 µs yielding
    first against ≈ 110 µs sleeping at once on this 2-core VM). A waiter yields while each yield returns
    quickly (``SHORT_YIELD``; a slower one means the core went to work that takes a while: sleep), for at
    most ``SPIN_SECONDS``. A yield that took more than ``LONG_YIELD`` means a process outside the job
    holds a core: yielding to it costs its whole time slice while a sleeper would preempt it on
    wake-up, so the process then sleeps at once for its next waits — 8, 16, … up to 4096 of them,
    doubling while such yields keep coming, back to 8 after ``CALM_SECONDS`` without one. (The job's own ranks
    make such yields too while they start or allocate, so the thresholds are loose: 2 ms, 1 s.)
    """

    MAX_SKIP = 4096

    def __init__(self, clock=time.perf_counter, yield_=os.sched_yield):
        self.clock, self.yield_ = clock, yield_
        self.skip = 0                   # waits left that sleep at once
        self.penalty = 4
        self.last_long = float("-inf")

    def spin(self, cond) -> bool:
        """Yield until ``cond()`` holds (True) or it is time to sleep (False)."""
        if cond():
            return True
        if self.skip > 0:
            self.skip -= 1
            return False
        clock = self.clock
        then = clock()
        end = then + SPIN_SECONDS
        while True:
            self.yield_()
            if cond():
                return True
            now = clock()
            took = now - then
            if took > SHORT_YIELD or now > end:
                return self._stop(now, took)
            then = now

    def spin_phase(self, phases, target: int) -> bool:
        """``spin(lambda: min(phases) >= target)`` written out — the host path's barrier, every small collective's
        wait: no closure to build and no call per check (each Python call costs 1-3 % of a small collective with
        8 ranks on 2 cores: docs/performance.md)."""
        if min(phases) >= target:
            return True
        if self.skip > 0:
            self.skip -= 1
            return False
        clock = self.clock
        then = clock()
        end = then + SPIN_SECONDS
        while True:
            self.yield_()
            if min(phases) >= target:
                return True
            now = clock()
            took = now - then
            if took > SHORT_YIELD or now > end:
                return self._stop(now, took)
            then = now

    def _stop(self, now: float, took: float) -> bool:
        """Stop yielding (False): the last yield took ``took`` s; one over ``LONG_YIELD`` starts or lengthens the
        run of waits that sleep at once."""
        if took > LONG_YIELD:
            if now - self.last_long > CALM_SECONDS:
                self.penalty = 4
            self.penalty = self.skip = min(2 * self.penalty, self.MAX_SKIP)
            self.last_long = now
        return False


SPINNER = Spinner()


def wait_until(cond, *, timeout: float, check=None, sleeper=None, spin: bool = True) -> None:
    """Wait until ``cond()``: yield the core first while that pays (``Spinner``), then sleep.

    ``sleeper(cond, seconds)`` blocks on the control block's futex until someone changes state; without
    it the wait sleeps with a short backoff. ``check()`` runs every ~0.2 s and raises to abort (dead
    peer); on timeout raises WaitAbort. Pure spinning is avoided: 8 cards on 2 cores starve each other.
    """
    if spin and SPINNER.spin(cond):
        return
    start = time.monotonic()
    next_check = start + 0.2
    delay = 0.00005
    while not cond():
        now = time.monotonic()
        if now - start > timeout:
            raise WaitAbort()
        if check is not None and now >= next_check:
            check()
            next_check = now + 0.2
        if sleeper is not None and futex.AVAILABLE:
            sleeper(cond, 0.05)
        else:
            time.sleep(delay)
            delay = min(delay * 2, 0.001)


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
