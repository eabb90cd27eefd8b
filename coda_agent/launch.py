"""The ``coda-agent`` console script. ``--version`` answers before the CLI loads (typer, rich, the task model; torch
only when a command that checks or runs a kernel needs it: ``tests/test_startup.py``)."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import cast

from . import version_line

#: The exit status when stdout's reader left early (``coda-agent api-doc | head -1``): 128 + SIGPIPE, what a
#: program that signal ends gives (``yes | head -1``), so a pipeline tells it from a finished command's status.
READER_GONE = 141


class ReaderGone(Exception):
    """A write to stdout found its reader gone. Raised in place of ``BrokenPipeError``, which click and rich each
    catch and turn into exit 1; no ``OSError``, so that nothing on the way takes it for a failed file operation."""


class _Stdout(io.RawIOBase):
    """The process's stdout file descriptor, whose writes raise :class:`ReaderGone` when its pipe has closed."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return os.isatty(self.fd)

    def write(self, data: bytes) -> int:  # type: ignore[override]  # a buffer protocol object, as RawIOBase's
        try:
            return os.write(self.fd, data)
        except BrokenPipeError:
            raise ReaderGone from None


@contextlib.contextmanager
def _stdout_reader_may_leave() -> Iterator[None]:
    """``sys.stdout`` as it was (encoding, buffering), over :class:`_Stdout`, put back after; left alone when
    already redirected (a test's capture). Once the reader has gone, the rest of the output goes to /dev/null."""
    original = sys.stdout
    if original is not sys.__stdout__:
        yield
        return
    stream = cast(io.TextIOWrapper, original)
    stream.flush()
    raw = _Stdout(stream.fileno())
    sys.stdout = io.TextIOWrapper(
        raw if isinstance(stream.buffer, io.RawIOBase) else io.BufferedWriter(raw),  # python -u: unbuffered still
        encoding=stream.encoding, errors=stream.errors, line_buffering=stream.line_buffering,
        write_through=stream.write_through,
    )
    try:
        try:
            yield
        finally:
            sys.stdout.flush()  # what is still buffered goes now, while a closed pipe can be told apart
    except ReaderGone:
        os.dup2(os.open(os.devnull, os.O_WRONLY), raw.fileno())  # what is left in the buffer goes nowhere
        raise
    finally:
        sys.stdout = original


def main() -> None:
    """Every command, ``--version`` included, ends alike when stdout's reader leaves before it is done: quietly,
    exit :data:`READER_GONE`, no traceback and no "Exception ignored" at exit. ``run`` and sweeps are the
    exception: they carry on to their end with stdout closed (their records keep everything)."""
    try:
        with _stdout_reader_may_leave():
            if sys.argv[1:] == ["--version"]:
                print(version_line())
                return
            from .cli import main as cli_main

            cli_main()
    except ReaderGone:
        sys.exit(READER_GONE)
