"""A rank forked from the fork server keeps what it inherited shared: the server's objects are frozen before the
fork (``gc.freeze``), so the rank's collections never write to them, and the rank collects its own garbage as
any fresh interpreter does."""

import os
import sys
import threading

import pytest

from launcher.forkserver import client

pytestmark = pytest.mark.timeout(120)

PROGRAM = """\
import gc

def dirty():
    try:
        with open("/proc/self/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Private_Dirty:"))
    except (OSError, StopIteration):
        return -1

class Cycle:
    pass

c = Cycle()
c.me = c
del c
before = dirty()
found = gc.collect()
after = dirty()
print(gc.isenabled(), gc.get_freeze_count(), found, before, after)
"""


def test_a_forked_rank_collects_its_garbage_without_dirtying_what_it_inherited(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NPUSIM_FORK_TORCH"}
    script = tmp_path / "gc_prog.py"
    script.write_text(PROGRAM)
    argv = [sys.executable, "-u", str(script)]
    server = client.ForkServer(sys.executable, env)       # its own: whatever server this process already has
    try:
        pipes = [os.pipe(), os.pipe()]
        ended, codes = threading.Event(), []
        server.spawn(argv, env, str(tmp_path), pipes[0][1], pipes[1][1],
                     lambda code: (codes.append(code), ended.set()))
        for _, w in pipes:
            os.close(w)
        out = b""
        while chunk := os.read(pipes[0][0], 1 << 16):
            out += chunk
        err = os.read(pipes[1][0], 1 << 16)
        for r, _ in pipes:
            os.close(r)
        assert ended.wait(60) and codes == [0], err.decode()
    finally:
        server.close()
    enabled, frozen, found, before, after = out.decode().split()
    assert enabled == "True"                 # the rank collects: the cycle it made is found
    assert int(found) >= 1
    assert int(frozen) > 10_000              # numpy, rt, hccl, ... as the server imported them
    if int(before) >= 0:                     # Linux: a full collection copies none of the inherited pages
        assert int(after) - int(before) < 2048, (before, after)
