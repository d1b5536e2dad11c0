"""Diagnostics: what npusim tells about a run besides its results. They observe the runtime; the runtime does not
depend on them.

- ``recorder.py`` the flight recorder (``NPUSIM_TRACE_*``, ``launch --profile``; docs/tracing.md), ``dumps.py`` its
  dump files and the automatic dumps;
- ``racecheck.py`` the stream race detector (``NPUSIM_RACE_CHECK``; docs/races.md);
- ``faults.py`` / ``faultspec.py`` fault injection (``NPUSIM_FAULTS``, ``launch --inject``; docs/faults.md);
- ``slog.py`` CANN's host log (plog files, levels, line format), ``callsite.py`` the user's frame of a call.

The first three are observers of the host's seam (``rt/host/seam.py``): each registers itself there when imported
(``rt/__init__.py`` imports them) and sees the runtime's events and the collective events of the packages above
rt. This package's ``__init__`` imports nothing, so ``rt.errors`` can use the log without loading the observers.
"""
