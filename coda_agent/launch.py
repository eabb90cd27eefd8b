"""The ``coda-agent`` console script. ``--version`` answers before the CLI loads (loading it imports torch)."""

from __future__ import annotations

import sys

from . import version_line


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        print(version_line())
        return
    from .cli import main as cli_main

    cli_main()
