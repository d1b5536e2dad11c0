"""The shared control block of one communicator on one node, and waiting on it.

Each communicator has one *control block* per node: a shared-memory array with one slot per rank
(phase counter for barriers, arrived/completed sequence numbers, the fingerprint of the call, where
its buffers live), one mailbox per ordered rank pair for send/recv, a futex word, and per rank two
staging areas for small collectives (``hccl/protocol/staged.py``). Rank 0's card of the node creates it on
first request; the other cards — and rank processes using the host path — map it from a file
descriptor. Waiting on it spins briefly, then sleeps on the futex (``_wait``).
"""

from __future__ import annotations

import os
import time

import numpy as np

from . import futex

# slot layout (int64 words)
PHASE, ARRIVED, DONE, STATUS, PID, CARD, FP_LEN, SLEEPING = range(8)
BUF0 = 9                       # send seg, off, size; recv seg, off, size; tmp seg, off, size
SLOT_WORDS = 64                # 512 bytes: words + fingerprint text
FP_OFF = 24 * 8
FP_MAX = (SLOT_WORDS * 8 - FP_OFF) // 2        # two fingerprints per slot, by sequence parity
STAGE_BYTES = 256 << 10                        # per rank and parity: small collectives go through here
# pair mailbox layout (int64 words)
P_SEND, P_RECV_DONE, P_SEG, P_OFF, P_SIZE, P_COUNT, P_DTYPE, V_SCOUNT, V_SDISPL, V_RCOUNT = range(10)
PAIR_WORDS = 10
ALIVE, HOST_GONE, CLOSED = 0, 1, 2


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
        self.wake_addr = self.wake_word.ctypes.data
        self.stage_base = 8 * end + 64
        self.raw = arr

    @staticmethod
    def nbytes(nranks: int) -> int:
        return 8 * (nranks * SLOT_WORDS + nranks * nranks * PAIR_WORDS) + 64 + nranks * 2 * STAGE_BYTES

    def stage(self, rank: int, parity: int) -> np.ndarray:
        """Rank's staging area for collectives of this sequence parity (uint8, STAGE_BYTES)."""
        base = self.stage_base + (2 * rank + parity) * STAGE_BYTES
        return self.raw[base: base + STAGE_BYTES]

    def notify(self) -> None:
        """State changed: wake the ranks that sleep on this block (no system call if none does)."""
        if self.slots[:, SLEEPING].any():
            self.wake_word[0] += 1
            futex.wake(self.wake_addr)

    def sleep(self, rank: int, cond, timeout: float) -> None:
        """Sleep until woken (or ``timeout``), unless ``cond()`` already holds."""
        slot = self.slots[rank]
        slot[SLEEPING] = 1
        seen = int(self.wake_word[0])
        try:
            if not cond():
                futex.wait(self.wake_addr, seen, timeout)
        finally:
            slot[SLEEPING] = 0

    def fingerprint(self, rank: int, seq: int) -> str:
        """What ``rank`` called as collective ``seq`` (kept for two sequence numbers: seq and seq-1)."""
        base = rank * SLOT_WORDS * 8 + FP_OFF + (seq % 2) * FP_MAX
        n = int(self.raw[base])
        return bytes(self.raw[base + 1: base + 1 + n]).decode("utf-8", "replace")

    def fingerprints_equal(self, seq: int) -> bool:
        """Whether every rank's fingerprint for ``seq`` equals rank 0's (length byte and text)."""
        start = FP_OFF + (seq % 2) * FP_MAX
        table = self.raw[: self.n * SLOT_WORDS * 8].reshape(self.n, SLOT_WORDS * 8)
        length = int(table[0, start])
        area = table[:, start: start + 1 + length]
        return bool((area == area[0]).all())

    def set_fingerprint(self, rank: int, seq: int, text: str) -> None:
        data = text.encode()[:FP_MAX - 1]
        base = rank * SLOT_WORDS * 8 + FP_OFF + (seq % 2) * FP_MAX
        self.raw[base + 1: base + 1 + len(data)] = np.frombuffer(data, np.uint8)
        self.raw[base] = len(data)


def wait_until(cond, *, timeout: float, check=None, sleeper=None, spins: int = 100) -> None:
    """Wait until ``cond()``: yield first (cheap when peers are close), then sleep.

    ``sleeper(cond, seconds)`` blocks on the control block's futex until someone changes state; without
    it the wait sleeps with a short backoff. ``check()`` runs every ~0.2 s and raises to abort (dead
    peer); on timeout raises WaitAbort. Pure spinning is avoided: 8 cards on 2 cores starve each other.
    """
    for _ in range(spins):
        if cond():
            return
        os.sched_yield()
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
