"""`python -m launcher ...` is the `launch` command."""

import sys

from .cli import main

sys.exit(main())
