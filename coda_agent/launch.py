"""The ``coda-agent`` console script. ``--version`` answers before the CLI loads (typer, rich, the task model;
torch only when a command that checks or runs a kernel needs it: ``tests/test_startup.py``)."""

from __future__ import annotations

import sys

from . import version_line
from .stdout import READER_GONE, ReaderGone, stdout_reader_may_leave


def main() -> None:
    """Every command, ``--version`` included, ends alike when stdout's reader leaves before it is done:
    quietly, exit :data:`READER_GONE`, no traceback and no "Exception ignored" at exit. ``run`` and sweeps are
    the exception: they carry on to their end with stdout closed (their records keep everything)."""
    try:
        with stdout_reader_may_leave():
            if sys.argv[1:] == ["--version"]:
                print(version_line())
                return
            from .cli import main as cli_main

            cli_main()
    except ReaderGone:
        sys.exit(READER_GONE)
