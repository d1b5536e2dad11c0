"""The fork server. Its torch variant: a program that imports torch is forked from a server that already imported
torch and torch_npu; other programs keep the plain server and never start the torch one. And what a rank inherits
stays shared: the server's objects are frozen before the fork (``gc.freeze``), so the rank's collections never
write to them, while the rank collects its own garbage as any fresh interpreter does."""

import os
import sys
import threading

import pytest

from launcher.forkserver import client

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("text, expected", [
    ("import torch\n", True),
    ("import os\n\nimport torch_npu  # noqa\n", True),
    ("from torch import nn\n", True),
    ("def f():\n    import torch.distributed as dist\n", True),
    ("import numpy\nimport torchvision\n", False),
    ("# import torch\nprint('no')\n", False),
    ("x = 'import torch'\n", False),
])
def test_imports_torch_reads_the_script(tmp_path, text, expected):
    script = tmp_path / "prog.py"
    script.write_text(text)
    assert client.imports_torch([sys.executable, "-u", str(script)]) is expected
    assert client.imports_torch([sys.executable, "-u", "-c", text]) is expected
    assert client.imports_torch([sys.executable, "-u", "-m", "torch.utils.collect_env"]) is False
    assert client.imports_torch([sys.executable, "-u", str(tmp_path / "missing.py")]) is False


def _run(server, argv, env, cwd):
    pipes = [os.pipe(), os.pipe()]
    ended, codes = threading.Event(), []
    server.spawn(argv, env, str(cwd), pipes[0][1], pipes[1][1], lambda code: (codes.append(code), ended.set()))
    for _, w in pipes:
        os.close(w)
    out = b""
    while chunk := os.read(pipes[0][0], 1 << 16):
        out += chunk
    err = os.read(pipes[1][0], 1 << 16)
    for r, _ in pipes:
        os.close(r)
    assert ended.wait(60)
    return codes[0], out.decode(), err.decode()


def test_a_torch_program_forks_with_torch_imported(tmp_path):
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k != "NPUSIM_FORK_TORCH"}
    plain = tmp_path / "plain.py"
    plain.write_text("import sys\nprint('torch' in sys.modules)\n")
    server = client.server_for([sys.executable, "-u", str(plain)], env)
    if server is None:
        pytest.skip("no fork server here (NPUSIM_FORK_SERVER=0)")
    assert not server.torch
    assert _run(server, [sys.executable, "-u", str(plain)], env, tmp_path)[:2] == (0, "False\n")

    script = tmp_path / "uses_torch.py"
    script.write_text("import sys\nprint('torch' in sys.modules, 'torch_npu' in sys.modules)\nimport torch\n")
    argv = [sys.executable, "-u", str(script)]
    server = client.server_for(argv, env)
    assert server is not None and server.torch, "the torch server did not start"
    code, out, err = _run(server, argv, env, tmp_path)
    assert (code, out) == (0, "True True\n"), err
    # a torch rank whose environment differs in what torch reads at import starts fresh
    assert client.server_for(argv, dict(env, TORCH_LOGS="+dynamo")) is None


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
        code, out, err = _run(server, argv, env, tmp_path)
    finally:
        server.close()
    assert code == 0, err
    enabled, frozen, found, before, after = out.split()
    assert enabled == "True"                 # the rank collects: the cycle it made is found
    assert int(found) >= 1
    assert int(frozen) > 10_000              # numpy, rt, hccl, ... as the server imported them
    if int(before) >= 0:                     # Linux: a full collection copies none of the inherited pages
        assert int(after) - int(before) < 2048, (before, after)
