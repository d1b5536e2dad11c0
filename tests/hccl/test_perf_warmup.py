"""hccl-test's sweep warm-up (``hccl/perf.py``): as nccl-tests' TimeTest, a barrier, then ``-w`` calls at the largest
size and ``-w`` at the smallest, before the first timed size."""

import types

from hccl import perf


class FakeBench:
    def __init__(self, collective, warmup):
        self.ns = types.SimpleNamespace(collective=collective, warmup=warmup)
        self.n, self.isz, self.comm = 4, 4, object()
        self.log = []
        self.hccl = types.SimpleNamespace(barrier=lambda comm: self.log.append("barrier"))

    def sync(self):
        self.log.append("sync")

    def fill(self, lay, in_place):
        self.log.append(("fill", lay["size"], in_place))
        return 1, 2

    def call(self, lay, send, recv):
        self.log.append(("call", lay["size"]))


def test_the_sweep_warms_up_at_the_largest_then_the_smallest_size():
    bench = FakeBench("all_reduce", 3)
    perf.warm_up(bench, [64 << 20, 1024])
    assert bench.log == ["barrier", "sync", ("fill", 64 << 20, False), *[("call", 64 << 20)] * 3, "sync",
                         ("fill", 1024, False), *[("call", 1024)] * 3, "sync"]


def test_a_broadcast_warms_up_in_place_and_no_warmup_makes_no_calls():
    bench = FakeBench("broadcast", 2)
    perf.warm_up(bench, [4096, 1024])
    assert ("fill", 4096, True) in bench.log and bench.log.count(("call", 1024)) == 2
    quiet = FakeBench("all_gather", 0)
    perf.warm_up(quiet, [4096, 1024])
    assert not any(isinstance(e, tuple) and e[0] == "call" for e in quiet.log)
