"""launch's "ranks joined n/N" (issue #25 item 5): the job board counts the parties of a key prefix without waiting,
and the launcher's JoinProgress reports each new count once, never blocking the job loop."""

import threading

from launcher.launch import progress
from rt.ray.actor import JobBoard


def test_the_board_counts_joined_ranks_by_prefix_during_and_after_the_rendezvous():
    board = JobBoard.__ray_metadata__.modified_class()
    assert board.joined("hccl/world-job1-") == (0, 0)
    got = {}
    waiters = [threading.Thread(target=lambda r=r: got.update({r: board.join("hccl/world-job1-0-1", 3, r, r, 30)}),
                                daemon=True) for r in (0, 1)]
    for w in waiters:
        w.start()
    for _ in range(200):
        if board.joined("hccl/world-job1-") == (2, 3):
            break
        threading.Event().wait(0.05)
    assert board.joined("hccl/world-job1-") == (2, 3)
    assert board.joined("hccl/world-job2-") == (0, 0)            # another job's prefix
    assert board.join("hccl/world-job1-0-1", 3, 2, 2, 30) == {"values": [0, 1, 2]}
    for w in waiters:
        w.join(10)
    assert got == {0: {"values": [0, 1, 2]}, 1: {"values": [0, 1, 2]}}
    assert board.joined("hccl/world-job1-") == (3, 3)            # remembered once everyone left
    assert board.join("hccl/world-job1-0-1", 3, 2, 2, 0) == {"joined": [2]}   # a new round of the key: times out


class FakeRef:
    def __init__(self, value):
        self.value = value


class FakeRay:
    """ray.wait / ray.get over FakeRefs; a ref is ready once the test says so."""

    class exceptions:
        RayError = RuntimeError

    def __init__(self):
        self.ready = set()

    def wait(self, refs, timeout):
        return [r for r in refs if id(r) in self.ready], []

    def get(self, ref):
        return ref.value


class FakeBoard:
    def __init__(self, answers):
        self.answers = list(answers)
        self.asked = []

    @property
    def joined(self):
        board = self

        class Method:
            @staticmethod
            def remote(prefix):
                board.asked.append(prefix)
                return FakeRef(board.answers.pop(0))
        return Method


def test_join_progress_reports_each_new_count_once_and_stops_at_the_world(monkeypatch, capsys):
    monkeypatch.setattr(progress, "EVERY", 0.0)
    ray, board = FakeRay(), FakeBoard([(0, 0), (5, 18), (5, 18), (18, 18)])
    p = progress.JoinProgress(ray, board, "hccl/world-j-", 18)
    for _ in range(4):
        p.tick()                          # asks
        p.tick()                          # not answered yet: nothing
        ray.ready.add(id(p._ref))
        p.tick()                          # the answer
    err = capsys.readouterr().err
    assert board.asked == ["hccl/world-j-"] * 4
    assert [line.split(" (")[0] for line in err.splitlines()] == ["npusim: ranks joined 5/18",
                                                                  "npusim: ranks joined 18/18"]
    assert p.done
    p.tick()
    assert len(board.asked) == 4                  # done: no more questions
