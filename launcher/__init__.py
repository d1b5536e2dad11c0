"""The npusim launcher: ``launch --nproc 8 script.py`` (the manual: ``launch/cli.py``) and ``launcher.spawn``.

Its code runs in several kinds of process (and a little in the ranks); the tree says which::

    module                                  runs in
    launch/cli.py flags.py config.py        launch (python -m launcher): parses the flags, reports how the job ended
    launch/job.py backends.py *_backend.py  the launching process — launch, spawn's caller, hccl-test: the job loop,
      output.py jobtrace.py profile.py        its backends (local, Ray, the launch --up cluster), the ranks' output
    agent/                                  the launching process, for its own node; a Ray actor on every other node
    forkserver/client.py                    the launching process (its node agent asks the server for ranks)
    forkserver/server.py                    the fork server, one per launching process
    forkserver/child.py                     each forked rank, from the fork to its exit
    spawn.py                                the caller of launcher.spawn
    spawned.py                              each rank of a spawn
    cluster/client.py                       launch, spawn, pytest, npu-smi: finding the launch --up cluster
    cluster/daemon.py                       the launch --up daemon (python -m launcher.cluster serve CONFIG)
    tools/smi.py smi_table.py               npu-smi
    tools/hccl_test.py                      hccl-test (the job loop in its own process; ranks run hccl/perf.py)
    pytest_plugin.py                        pytest (entry point pytest11)
    deathsig.py                             any of them that starts a child (PR_SET_PDEATHSIG)
"""

from .launch.cli import main
from .spawn import LaunchError, spawn

__all__ = ["LaunchError", "main", "spawn"]
