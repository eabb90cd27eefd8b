"""Turning candidate source text into a callable ``forward``, and errors into the candidate's own lines."""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

_counter = itertools.count()
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class CandidateModule:
    """A candidate written to a real file and imported, so tracebacks and QuACK's source fingerprint work."""

    def __init__(self, source: str, path: Path) -> None:
        self.path = path
        if not path.exists() or path.read_text() != source:
            path.write_text(source)
        name = f"coda_candidate_{next(_counter)}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        self.module = importlib.util.module_from_spec(spec)
        sys.modules[name] = self.module
        spec.loader.exec_module(self.module)
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
