"""`python -m launcher ...` is the `launch` command."""

import sys

from .launch.cli import main

sys.exit(main())
