"""How processes find their cards: a rank waits (bounded) for a card that is still booting, and card
actors carry the DESIGN's names."""

import os
import threading

import pytest

from rt import errors
from rt.host import backends
from rt.card.card import Card
from rt.wire.server import CardServer
from rt.config import load_config


def test_rank_waits_for_a_card_socket_that_appears_late(tmp_path):
    card = Card(node=0, index=1, capacity=8 << 20)
    path = os.path.join(tmp_path, "npu0_1.sock")
    servers = []
    timer = threading.Timer(0.3, lambda: servers.append(CardServer(card, path)))
    timer.start()
    try:
        got = []
        transport = backends.SocketDirCards(load_config(), str(tmp_path), 0).connect(
            1, lambda msg, fds: got.append(msg), None)
        transport.send([0, 1, "ping", []])
        deadline = threading.Event()
        for _ in range(100):
            if got:
                break
            deadline.wait(0.02)
        assert got == [[1, True, True]]
        transport.close()
    finally:
        timer.join()
        for s in servers:
            s.close()
        card.close()


def test_a_card_that_never_boots_is_named_after_the_wait(tmp_path, monkeypatch):
    monkeypatch.setenv("NPUSIM_CARD_WAIT", "0.2")
    with pytest.raises(errors.AclError) as info:
        backends.SocketDirCards(load_config(), str(tmp_path), 0).connect(3, lambda m, f: None, None)
    assert info.value.code == 207004
    assert "card 3 of node 0" in info.value.message and "0.2 s" in info.value.message


def test_card_actors_are_named_npu_node_id_in_the_jobs_namespace(ray_session):
    import ray
    from rt.ray import session
    cfg = load_config()
    cards = session.create_cards("nametest", 0, ray.get_runtime_context().get_node_id(), cfg, count=1)
    try:
        actor = ray.get_actor("npu:0:0", namespace=session.card_namespace("nametest"))
        assert ray.get(actor.address.remote()) == os.path.join(cards.socket_dir, "npu0_0.sock")
        with pytest.raises(ValueError):
            ray.get_actor("npu:0:0", namespace=session.card_namespace("another-job"))
    finally:
        session.destroy_cards(cards)
