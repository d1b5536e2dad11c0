"""The npusim launcher: `launch --nproc 8 script.py` (see launcher/cli.py) and `launcher.spawn`."""

from .cli import main
from .spawn import LaunchError, spawn

__all__ = ["LaunchError", "main", "spawn"]
