"""Reading and writing run directories (the layout and schema are in :mod:`coda_agent.store.records`).

The writer only ever replaces whole files atomically, so any reader (the resume path, the index, the
viewer) sees either the previous or the next version of a file, never half of one.
"""

from __future__ import annotations

import re
import secrets
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from .. import settings
from ..atomic import write_text_atomic
from .records import SCHEMA_VERSION, Attempt, RunHeader, RunSummary, write_json_atomic

HEADER, SUMMARY, BEST, ATTEMPTS = "header.json", "summary.json", "best.py", "attempts"
_ATTEMPT_FILE = re.compile(r"^(\d{4,})\.json$")
M = TypeVar("M", bound=BaseModel)


class RunRecordError(Exception):
    """A run directory is missing, unreadable or from an incompatible schema; the message says which file."""


def default_runs_dir() -> Path:
    """Where run records go (``coda_agent.settings``)."""
    return settings.runs_dir()


def new_run_id(task: str, created: datetime) -> str:
    """``<YYYYmmdd-HHMMSS>_<task>_<6 hex>``: sorts by time, says what ran, never collides in practice."""
    return f"{created:%Y%m%d-%H%M%S}_{task}_{secrets.token_hex(3)}"


def resolve_run(name_or_path: str | Path, runs_dir: Path | None = None) -> Path:
    """A run directory given as a path, or as a run id (or unique id prefix/suffix) under ``runs_dir``."""
    p = Path(name_or_path)
    if (p / HEADER).exists():
        return p
    base = runs_dir or default_runs_dir()
    if (base / p / HEADER).exists():
        return base / p
    text = str(name_or_path)
    matches = sorted(d for d in base.glob("*") if (d / HEADER).exists() and (d.name.startswith(text) or d.name.endswith(text)))
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise RunRecordError(f"{text!r} matches {len(matches)} runs in {base}: {', '.join(m.name for m in matches[:5])}")
    raise RunRecordError(f"no run {text!r}: not a run directory, and no run of that name in {base}")


def attempt_file(run_dir: Path, index: int) -> Path:
    return run_dir / ATTEMPTS / f"{index:04d}.json"


class RunWriter:
    """Writes one run directory: the header once, each attempt when it finishes, the summary and best.py."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    @classmethod
    def create(cls, runs_dir: Path, header: RunHeader) -> RunWriter:
        """A fresh directory ``runs_dir/<header.run_id>`` with the header written."""
        run_dir = runs_dir / header.run_id
        if run_dir.exists():
            raise RunRecordError(f"{run_dir} already exists")
        (run_dir / ATTEMPTS).mkdir(parents=True)
        writer = cls(run_dir)
        writer.write_header(header)
        return writer

    def write_header(self, header: RunHeader) -> None:
        write_json_atomic(self.run_dir / HEADER, header)

    def write_attempt(self, attempt: Attempt) -> Path:
        path = attempt_file(self.run_dir, attempt.index)
        write_json_atomic(path, attempt)
        return path

    def write_summary(self, summary: RunSummary) -> None:
        write_json_atomic(self.run_dir / SUMMARY, summary)

    def write_best(self, code: str) -> None:
        write_text_atomic(self.run_dir / BEST, code)


class RunReader:
    """Reads a run directory, complete or interrupted (even by ``kill -9``: only whole files exist)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.header = self._load(run_dir / HEADER, RunHeader)
        if self.header.schema_version > SCHEMA_VERSION:
            raise RunRecordError(
                f"{run_dir / HEADER}: schema version {self.header.schema_version} is newer than this coda-agent "
                f"understands ({SCHEMA_VERSION}); upgrade coda-agent"
            )

    @staticmethod
    def _load(path: Path, model: type[M]) -> M:
        try:
            return model.model_validate_json(path.read_text())
        except FileNotFoundError:
            raise RunRecordError(f"{path}: missing (is {path.parent} a run directory?)") from None
        except (OSError, ValidationError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise RunRecordError(f"{path}: unreadable run record ({first})") from None

    def attempt_files(self) -> list[Path]:
        folder = self.run_dir / ATTEMPTS
        return sorted(p for p in folder.glob("*.json") if _ATTEMPT_FILE.match(p.name)) if folder.exists() else []

    def attempts(self) -> list[Attempt]:
        """Every finished attempt, by index."""
        return sorted((self._load(p, Attempt) for p in self.attempt_files()), key=lambda a: a.index)

    def unreadable_attempts(self) -> list[Path]:
        """Attempt files that do not parse (edited by hand, cut short by a full disk...)."""
        bad = []
        for p in self.attempt_files():
            try:
                self._load(p, Attempt)
            except RunRecordError:
                bad.append(p)
        return bad

    def set_aside_unreadable(self, candidates_per_round: int) -> list[Path]:
        """Rename unreadable attempts to ``*.json.corrupt``, and every attempt of a later round (its prompt was
        built from the lost one) to ``*.json.superseded``, so a resume redoes them; returns the files moved."""
        bad = self.unreadable_attempts()
        if not bad:
            return []
        first_round = min((int(p.stem) - 1) // candidates_per_round + 1 for p in bad)
        later = [p for p in self.attempt_files() if p not in bad and int(p.stem) > first_round * candidates_per_round]
        for p, suffix in [*((p, ".corrupt") for p in bad), *((p, ".superseded") for p in later)]:
            p.rename(p.with_name(p.name + suffix))
        return [*bad, *later]

    def summary(self) -> RunSummary | None:
        path = self.run_dir / SUMMARY
        return self._load(path, RunSummary) if path.exists() else None

    def best_code(self) -> str | None:
        path = self.run_dir / BEST
        return path.read_text() if path.exists() else None


