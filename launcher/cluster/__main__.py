"""``python -m launcher.cluster serve CONFIG``: the daemon ``launch --up`` starts (``daemon.py``)."""

import sys

from .daemon import serve

if len(sys.argv) == 3 and sys.argv[1] == "serve":
    serve(sys.argv[2])
else:
    sys.exit("usage: python -m launcher.cluster serve CONFIG  (use `launch --up` / `launch --down`)")
