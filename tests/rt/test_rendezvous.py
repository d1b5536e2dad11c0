"""rt's blocking rendezvous by key (``rt/rendezvous.py``): what the job's board and in-process cards meet through."""

import threading

from rt.rendezvous import Rendezvous


def test_parties_of_one_key_get_every_value_in_index_order():
    meeting = Rendezvous()
    got = {}
    threads = [threading.Thread(target=lambda i=i: got.update({i: meeting.join("k", 3, i, f"v{i}", 10.0)}))
               for i in (2, 0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert got == {i: {"values": ["v0", "v1", "v2"]} for i in range(3)}
    assert meeting.join("k", 1, 0, "again", 1.0) == {"values": ["again"]}     # the last party out forgot "k"


def test_a_second_join_of_one_index_and_a_timeout_are_answered_not_raised():
    meeting = Rendezvous()
    assert meeting.join("k", 2, 0, "a", 0.05) == {"joined": [0]}
    assert meeting.join("k", 2, 0, "a", 0.05) == {"twice": True}
    assert meeting.join("n", 2, 1, "b", -1) == {"joined": [1]}                  # a negative wait: no wait
