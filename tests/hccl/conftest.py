"""Fixtures for the HCCL end-to-end tests: one in-process runtime of 8 cards per test module, cached
communicators over subsets of those cards, and helpers that move numpy arrays onto a rank's card.

Communicators are created once per (devices, HCCL env) and reused, so a module's many small
collectives stay cheap. Tests that break a communicator on purpose (timeouts, dead peers) make
their own with ``fresh_comms``.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

HCCL_ENV = ("HCCL_ALGO", "HCCL_DETERMINISTIC", "HCCL_EXEC_TIMEOUT", "HCCL_CONNECT_TIMEOUT")
# Ranks of each world size used by the tests; deliberately not always starting at card 0.
WORLDS = {1: [5], 2: [0, 1], 3: [2, 3, 4], 5: [3, 4, 5, 6, 7], 8: list(range(8))}


@pytest.fixture(scope="module")
def hccl_rt():
    """``rt`` initialized once for the module with 8 in-process cards (no Ray); finalized after."""
    import rt
    with pytest.MonkeyPatch.context() as mp:
        for name in ("ASCEND_RT_VISIBLE_DEVICES", "NPUSIM_BACKEND", "NPUSIM_CARD_DIR", *HCCL_ENV):
            mp.delenv(name, raising=False)
        rt.init(backend="local")
        try:
            yield rt
        finally:
            if rt.is_initialized():
                rt.finalize()


@contextlib.contextmanager
def hccl_env(**env):
    """Set HCCL_* variables (None removes one) for the duration of a communicator init."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            if value is None:
                mp.delenv(name, raising=False)
            else:
                mp.setenv(name, str(value))
        yield


class Comms:
    """Cached ``comm_init_all`` communicators of the module runtime."""

    def __init__(self, rt):
        self.rt = rt
        self.cache: dict[tuple, list] = {}

    def world(self, n: int, **env) -> list:
        """Communicators of the n-rank world of ``WORLDS`` (created under ``env``), reused."""
        return self.over(WORLDS[n], **env)

    def over(self, devices, **env) -> list:
        key = (tuple(devices), tuple(sorted(env.items())))
        if key not in self.cache:
            self.cache[key] = self.fresh(devices, **env)
        return self.cache[key]

    def fresh(self, devices, **env) -> list:
        """New communicators (not cached): for tests that leave a communicator broken."""
        import hccl
        with hccl_env(**env):
            return hccl.comm_init_all(list(devices))

    # -- helpers (methods so test modules need not import conftest) ------------------------------
    @staticmethod
    def upload(comm, array):
        """``array`` as an rt.Tensor on ``comm``'s card (leaves that card current in this thread)."""
        import rt
        rt.set_context(comm.ctx)
        return rt.Tensor.from_numpy(np.ascontiguousarray(array))

    @classmethod
    def filled(cls, comm, count: int, dtype, fill=None):
        """``count`` elements on ``comm``'s card holding a sentinel, so memory left untouched shows."""
        dt = np.dtype(dtype)
        if fill is None:
            fill = 0x5A if dt.kind in "iu" else 7.0
        return cls.upload(comm, np.full(count, fill, dtype=dt))

    @staticmethod
    def sync(comms) -> None:
        for c in comms:
            c.synchronize()

    @staticmethod
    def errors(comms) -> list:
        """Synchronize every rank; per rank the HcclError its stream raised, or None."""
        import hccl
        out = []
        for c in comms:
            try:
                c.synchronize()
                out.append(None)
            except hccl.HcclError as e:
                out.append(e)
        return out

    @staticmethod
    def free(*tensor_lists) -> None:
        for ts in tensor_lists:
            for t in ts:
                if t is not None:
                    t.free()


@pytest.fixture(scope="module")
def comms(hccl_rt):
    """The module's communicator cache and tensor helpers."""
    return Comms(hccl_rt)
