"""A world whose cards and ranks cannot fit in the memory available is refused at once, naming the estimate
(issue #25 item 4), instead of swapping or being killed while its cards boot."""

import pytest

from launcher.launch import ray_backend
from rt import memlimit
from rt.errors import AclError

GIB = 1 << 30


def fake_budget(available: int):
    return lambda root="/": memlimit.MemoryBudget(24 * GIB, available, None)


def test_a_world_that_cannot_fit_is_refused_naming_the_estimate(monkeypatch):
    monkeypatch.setattr(memlimit, "budget", fake_budget(2 * GIB))
    with pytest.raises(AclError) as e:
        ray_backend.check_world_fits(32, 8)                     # 256 ranks: 0.44 + 256 x 74 MiB = 18.9 GiB
    assert e.value.code == 207001
    msg = e.value.message
    assert "--nnodes 32 --nproc 8 (256 ranks and cards) needs about 18.9 GiB" in msg, msg
    assert "62 MiB a card, 12 MiB a rank" in msg and "only 2.0 GiB is available" in msg and "lower --nnodes" in msg


def test_a_world_that_fits_passes(monkeypatch):
    monkeypatch.setattr(memlimit, "budget", fake_budget(20 * GIB))
    ray_backend.check_world_fits(32, 8)
    ray_backend.check_world_fits(1, 8)
