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
        ray_backend.check_world_fits(32, 8)                     # a worker per card: 0.44 + 256 x 72 MiB
    assert e.value.code == 207001
    msg = e.value.message
    assert "--nnodes 32 --nproc 8 (256 ranks and cards, in 256 card processes) needs about 18.4 GiB" in msg, msg
    assert "56 MiB a card process, 4 MiB a card, 12 MiB a rank" in msg and "only 2.0 GiB is available" in msg
    assert "lower --nnodes" in msg
    with pytest.raises(AclError) as e:
        ray_backend.check_world_fits(32, 8, per_host=8)         # a host per node: 0.44 + 32 x 56 + 256 x 16 MiB
    assert "(256 ranks and cards, in 32 card processes) needs about 6.2 GiB" in e.value.message


def test_a_world_that_fits_passes(monkeypatch):
    monkeypatch.setattr(memlimit, "budget", fake_budget(20 * GIB))
    ray_backend.check_world_fits(32, 8)
    ray_backend.check_world_fits(1, 8)
    monkeypatch.setattr(memlimit, "budget", fake_budget(7 * GIB))
    ray_backend.check_world_fits(32, 8, per_host=8)


def test_a_nodes_cards_share_a_host_unless_one_is_killed_and_the_override_is_checked(monkeypatch):
    monkeypatch.delenv("NPUSIM_CARDS_PER_HOST", raising=False)
    assert ray_backend.cards_per_host(8, 8) == 8 and ray_backend.cards_per_host(16, 4) == 4
    assert ray_backend.cards_per_host(64, 8) == 8
    kill = "kill_card:card=1:collective=2"          # the card killed must die alone: a worker per card
    assert ray_backend.cards_per_host(8, 8, kill) == 1 and ray_backend.cards_per_host(16, 8, f"delay:ms=5;{kill}") == 1
    assert ray_backend.cards_per_host(8, 8, "kill:rank=1:collective=2") == 8
    assert ray_backend.cards_per_host(64, 8, kill) == 8            # too many workers to boot: hosts as before
    monkeypatch.setenv("NPUSIM_CARDS_PER_HOST", "1")
    assert ray_backend.cards_per_host(8, 8) == 1 and ray_backend.cards_per_host(64, 8) == 1
    monkeypatch.setenv("NPUSIM_CARDS_PER_HOST", "4")
    assert ray_backend.cards_per_host(8, 8) == 4
    for bad in ("abc", "0", "65"):
        monkeypatch.setenv("NPUSIM_CARDS_PER_HOST", bad)
        with pytest.raises(AclError) as e:
            ray_backend.cards_per_host(8, 8)
        assert e.value.code == 100000 and "NPUSIM_CARDS_PER_HOST must be an int in [1, 64]" in e.value.message
