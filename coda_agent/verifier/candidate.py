"""Turning candidate source text into a callable ``forward``, and errors into the candidate's own lines."""

from __future__ import annotations

import itertools
import re
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..tasks.loader import import_file

_counter = itertools.count()
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class CandidateModule:
    """A candidate written to a real file and imported, so tracebacks and QuACK's source fingerprint work."""

    def __init__(self, source: str, path: Path | None = None) -> None:
        self.path = path or Path(tempfile.mkdtemp(prefix="coda_candidate_")) / "candidate.py"
        self.path.write_text(source)
        self.module = import_file(self.path, f"coda_candidate_{next(_counter)}")
        fn = getattr(self.module, "forward", None)
        if not callable(fn):
            raise TypeError("the candidate module must define forward(**inputs)")
        self.forward: Callable[..., Any] = fn


def candidate_trace(exc: BaseException, path: Path, limit: int = 1200) -> str:
    """The exception message plus the candidate's own frames (``line N: code``), trimmed for a prompt."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    lines = [f"line {f.lineno}: {(f.line or '').strip()}" for f in frames]
    msg = _ANSI.sub("", f"{type(exc).__name__}: {exc}").strip()
    if len(msg) > limit:
        msg = msg[: limit // 2] + " ... " + msg[-limit // 2 :]
    return "\n".join([*lines, msg]) if lines else msg
