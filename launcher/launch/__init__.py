"""The ``launch`` process: the command line (``cli.py``: parses and reports only; ``flags.py``, ``config.py``), the
job loop that owns restarts (``job.py``), the backends it runs on (``backends.py``: local, Ray, the ``launch --up``
cluster), and what it does with the ranks' output (``output.py``, ``jobtrace.py``, ``profile.py``). ``spawn`` and
``hccl-test`` run the same job loop in their own process."""
