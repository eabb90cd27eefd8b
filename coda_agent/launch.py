"""The ``coda-agent`` console script. ``--version`` answers before the CLI loads (typer, rich, the task model; torch
only when a command that checks or runs a kernel needs it: ``tests/test_startup.py``)."""

from __future__ import annotations

import sys

from . import version_line


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        print(version_line())
        return
    from .cli import main as cli_main

    cli_main()
