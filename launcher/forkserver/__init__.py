"""A pre-imported, single-threaded fork server for rank processes.

A rank is ``python -u <program>``; a fresh interpreter that imports numpy, ``rt`` and ``hccl`` costs ~0.2 s of
CPU, and 8 of them on a 2-core laptop are most of a small distributed test. The fork server is one such
interpreter, started once per launching process with those modules imported and no threads (BLAS pinned to one
thread before numpy loads); each rank is a ``fork`` of it that then becomes exactly what ``python -u`` would
have been: its own session, the rank's environment, working directory, ``sys.argv``, ``sys.path`` and stdio
(the agent's pipes, passed over the server's socket), the program run as ``__main__`` (``-c``, a script, or
``-m``), and the same exit status — an uncaught exception's traceback and status 1, ``sys.exit``'s code, death
by SIGINT after a KeyboardInterrupt. Ranks die with the server (PDEATHSIG), the server dies with the launching
process (PDEATHSIG, set from a thread that lives as long as the process), and the server reports each rank's
exit status, which only it can reap.

Used only when the result is indistinguishable from a fresh interpreter: the rank runs this Python with ``-u``
and no environment variable that shapes interpreter start-up differs from the server's (``PYTHONHASHSEED``,
``PYTHONWARNINGS``, ``OMP_NUM_THREADS``, ``LD_PRELOAD``, ...); otherwise, or with ``NPUSIM_FORK_SERVER=0``,
ranks start as before. Two differences remain by construction: ranks forked from one server share its hash
seed (``hash()`` of a str is the same on every rank), and what the server imported is frozen (``gc.freeze()``
before each fork, ``gc.get_freeze_count()`` > 0 in the rank), so the rank's collections skip those objects and
never copy the pages they share with the server — with torch preloaded a rank's first full collection took
242 ms and copied 39 MiB before, 0.4 ms and nothing now. Set ``NPUSIM_FORK_SERVER=0`` to start each rank fresh.
``NPUSIM_FORK_PRELOAD=mod1,mod2`` adds modules the server imports before forking (the pytest plugin adds
``pytest``, which every rank of a test imports with the test's module).

A program that imports torch (``import torch``/``torch_npu`` in the script or ``-c`` code, read without running
it) gets a second server that has also imported ``torch``, ``torch.distributed`` and ``torch_npu`` — ~1 s of CPU
per rank otherwise — started on the first such rank; other programs never start it, so they do not pay for
torch. Its ranks must also agree with it on the variables torch reads while importing (``TORCH*``,
``PYTORCH*``, ``KMP_*``, ``GOMP_*``, ``MKL_*``, ``OMP_*``). ``NPUSIM_FORK_TORCH=0`` forks torch programs from
the plain server.

Three processes, one module each: ``client.py`` runs in the launching process (the node agent's: it starts the
server and asks it for ranks), ``server.py`` is the server's own loop, ``child.py`` what a forked child does to
become the rank.
"""
