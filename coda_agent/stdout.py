"""stdout whose reader may leave early (``coda-agent api-doc | head -1``): its writes raise
:class:`ReaderGone`, which the console script turns into one exit status and the commands that carry on
(``run``, sweeps) catch. Torch-free and rich-free: the console script imports it before any command loads."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import cast

#: The exit status when stdout's reader left early (``coda-agent api-doc | head -1``): 128 + SIGPIPE, what a
#: program that signal ends gives (``yes | head -1``), so a pipeline tells it from a finished command's
#: status.
READER_GONE = 141


class ReaderGone(Exception):
    """A write to stdout found its reader gone. Raised in place of ``BrokenPipeError``, which click and rich
    each catch and turn into exit 1; no ``OSError``, so that nothing on the way takes it for a failed file
    operation."""


class _Stdout(io.RawIOBase):
    """The process's stdout file descriptor, whose writes raise :class:`ReaderGone` when its pipe has
    closed."""

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
def stdout_reader_may_leave() -> Iterator[None]:
    """``sys.stdout`` as it was (encoding, buffering), over :class:`_Stdout`, put back after; left alone when
    already redirected (a test's capture). Once the reader has gone, the rest of the output goes to
    /dev/null."""
    original = sys.stdout
    if original is not sys.__stdout__:
        yield
        return
    stream = cast(io.TextIOWrapper, original)
    stream.flush()
    raw = _Stdout(stream.fileno())
    sys.stdout = io.TextIOWrapper(
        # python -u: unbuffered still
        raw if isinstance(stream.buffer, io.RawIOBase) else io.BufferedWriter(raw),
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
