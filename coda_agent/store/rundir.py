"""The run directory: its layout, the writer, the strict and the tolerant reader, finding a run, the summary
roll-up.

Layout of one run, ``runs/<YYYYmmdd-HHMMSS>_<task>_<id>/`` (the schema of each file is in ``records.py``)::

    header.json          RunHeader: what was run, with what, where (written at the start; a resume that
                         extends the budgets rewrites it)
    attempts/0001.json   Attempt: one candidate, from prompt to verdict (written when it finishes)
    summary.json         RunSummary: rolled up after every attempt (status, best, totals)
    best.py              the best correct candidate, exported as a file
    writer.lock          who is writing the run now (``writer_lock``); gone once the writer ends

One process writes a run at a time: :class:`RunWriter` holds the run's writer lock from opening the run to
:meth:`RunWriter.close`, so a second ``run --resume`` of a live run is refused instead of overwriting its
attempts. A run whose summary says ``running`` but whose writer is gone (``kill -9``, a power cut) reads as
``interrupted``.

The writer only ever replaces whole files atomically, so a run killed at any point (even ``kill -9``) loses
only the attempts in flight, and every reader sees either the previous or the next version of a file.

Two readers share the layout and the file parser. :class:`RunReader` is strict, for whatever continues a run
(resume, replay, sweeps): a file that does not parse is an error naming it. :func:`read_run` is tolerant, for
whatever shows runs (the index, ``show``, ``diff``, the viewer): an unreadable file becomes a :class:`Problem`
and everything else is kept. :func:`resolve_run` turns what a user types into a run directory, for both.
"""

from __future__ import annotations

import re
import secrets
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from ..atomic import write_text_atomic
from .ranking import attempt_time_us, best_attempt, estimate_sol_fraction
from .records import (
    RESUMABLE,
    SCHEMA_VERSION,
    Attempt,
    RunHeader,
    RunSummary,
    UnreadableRecord,
    read_json_record,
    read_record_text,
    write_json_atomic,
)
from .writer_lock import Holder, WriterBusy, WriterLock, read_holder

M = TypeVar("M", bound=BaseModel)

HEADER, SUMMARY, BEST, ATTEMPTS, LOCK = "header.json", "summary.json", "best.py", "attempts", "writer.lock"
_ATTEMPT_FILE = re.compile(r"^(\d{4,})\.json$")
#: The run reference that means the newest run in the folder.
LATEST = "latest"


class RunRecordError(Exception):
    """A run directory is missing, unreadable or from an incompatible schema; the message says which file."""


class RunBusy(RunRecordError):
    """Another live process is writing the run; the message names it and what to do (one line)."""


def resume_command(run_dir: Path) -> str:
    """What continues the run in ``run_dir`` (the CLI's ``--resume``)."""
    return f"coda-agent run --resume {run_dir}"


def new_run_id(task: str, created: datetime) -> str:
    """``<YYYYmmdd-HHMMSS>_<task>_<6 hex>``: sorts by time, says what ran, never collides in practice."""
    return f"{created:%Y%m%d-%H%M%S}_{task}_{secrets.token_hex(3)}"


def attempt_file(run_dir: Path, index: int) -> Path:
    return run_dir / ATTEMPTS / f"{index:04d}.json"


def attempt_files(run_dir: Path) -> list[Path]:
    """The finished attempts' files, by index (temporary files and ones set aside are not attempts)."""
    folder = run_dir / ATTEMPTS
    return sorted(p for p in folder.glob("*.json") if _ATTEMPT_FILE.match(p.name)) if folder.is_dir() else []


def record_files(run_dir: Path) -> list[Path]:
    """Every file of the record that exists (what the index watches for changes, with
    :func:`writer_alive`)."""
    named = [run_dir / n for n in (HEADER, SUMMARY, BEST) if (run_dir / n).exists()]
    return named + attempt_files(run_dir)


def writer_alive(run_dir: Path) -> bool:
    """A live process is writing the run now (without taking its lock)."""
    holder = read_holder(run_dir / LOCK)
    return holder is not None and holder.alive()


def is_run_dir(path: Path) -> bool:
    """A folder with a header or an attempts folder: a run, however far it got."""
    return (path / HEADER).is_file() or (path / ATTEMPTS).is_dir()


def iter_run_dirs(runs_dir: Path) -> Iterator[Path]:
    """Every folder in the runs folder, hidden ones skipped: those that are no run show as problems, not as
    nothing."""
    if runs_dir.is_dir():
        yield from (d for d in sorted(runs_dir.iterdir()) if d.is_dir() and not d.name.startswith("."))


# --------------------------------------------------------------------------------------------------
# Finding a run


def resolve_run(ref: str | Path, runs_dir: Path) -> Path:
    """The run directory ``ref`` names: a path to one; a folder name or run id in ``runs_dir``, or a unique
    prefix or suffix of either; or ``latest``, the run there created last. RunRecordError says why none or
    which several."""
    text = str(ref)
    if not text:
        raise RunRecordError("no run named: give a run folder, its run id or a unique prefix")
    for candidate in (Path(ref), runs_dir / text):
        if is_run_dir(candidate):
            return candidate
    runs = [d for d in iter_run_dirs(runs_dir) if is_run_dir(d)]
    headers = {d: _header_or_none(d) for d in runs}
    if text == LATEST:
        dated = [(h.created.timestamp(), d.name, d) for d, h in headers.items() if h is not None]
        if not dated:
            raise RunRecordError(f"no run in {runs_dir} yet ({LATEST!r} names the newest)")
        return max(dated)[2]
    if "/" in text or Path(text).name != text:
        raise RunRecordError(f"no run {text!r}: not a run directory")
    names = {d: {d.name} | ({h.run_id} if h is not None else set()) for d, h in headers.items()}
    matches = [d for d, ns in names.items() if text in ns]
    if not matches:
        matches = [d for d, ns in names.items() if any(n.startswith(text) or n.endswith(text) for n in ns)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        shown = ", ".join(m.name for m in matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise RunRecordError(f"{text!r} matches {len(matches)} runs in {runs_dir}: {shown}")
    raise RunRecordError(f"no run {text!r}: not a run directory, and no run of that name in {runs_dir}")


def _header_or_none(run_dir: Path) -> RunHeader | None:
    try:
        return read_json_record(run_dir / HEADER, RunHeader)
    except UnreadableRecord:
        return None


# --------------------------------------------------------------------------------------------------
# Writing


class RunWriter:
    """Writes one run directory: the header once, each attempt when it finishes, the summary and best.py; the
    one writer of the run from :meth:`create` or :meth:`open` to :meth:`close` (it holds the run's writer
    lock)."""

    def __init__(self, run_dir: Path, lock: WriterLock) -> None:
        self.run_dir, self._lock = run_dir, lock

    @classmethod
    def create(cls, runs_dir: Path, header: RunHeader) -> RunWriter:
        """A fresh directory ``runs_dir/<header.run_id>`` with the header written."""
        run_dir = runs_dir / header.run_id
        if run_dir.exists():
            raise RunRecordError(f"{run_dir} already exists")
        (run_dir / ATTEMPTS).mkdir(parents=True)
        writer = cls.open(run_dir)
        writer.write_header(header)
        return writer

    @classmethod
    def open(cls, run_dir: Path) -> RunWriter:
        """The writer of an existing run (to resume it); RunBusy when a live process writes it now."""
        if not is_run_dir(run_dir):
            raise RunRecordError(f"{run_dir}: not a run directory")
        try:
            return cls(run_dir, WriterLock.acquire(run_dir / LOCK, f"run {run_dir.name}"))
        except WriterBusy as exc:
            raise RunBusy(str(exc)) from None
        except OSError as exc:  # a read-only runs folder, a file system without links
            raise RunRecordError(f"cannot lock {run_dir / LOCK}: {exc.strerror or exc}") from None

    def close(self) -> None:
        """Done writing: another process may now resume the run."""
        self._lock.release()

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


# --------------------------------------------------------------------------------------------------
# Reading, strictly


def _load(path: Path, model: type[M]) -> M:
    if not path.exists():
        raise RunRecordError(f"{path}: missing (is {path.parent} a run directory?)")
    try:
        return read_json_record(path, model)
    except UnreadableRecord as exc:
        raise RunRecordError(f"{path}: unreadable run record ({exc.reason})") from None


class RunReader:
    """Reads a run directory, complete or interrupted (even by ``kill -9``: only whole files exist); any file
    that does not parse is a RunRecordError naming it."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.header = _load(run_dir / HEADER, RunHeader)
        if self.header.schema_version > SCHEMA_VERSION:
            raise RunRecordError(
                f"{run_dir / HEADER}: schema version {self.header.schema_version} is newer than this "
                f"coda-agent understands ({SCHEMA_VERSION}); upgrade coda-agent"
            )

    def attempt_files(self) -> list[Path]:
        return attempt_files(self.run_dir)

    def attempts(self) -> list[Attempt]:
        """Every finished attempt, by index."""
        return sorted((_load(p, Attempt) for p in self.attempt_files()), key=lambda a: a.index)

    def unreadable_attempts(self) -> list[Path]:
        """Attempt files that do not parse (edited by hand, cut short by a full disk...)."""
        bad = []
        for p in self.attempt_files():
            try:
                _load(p, Attempt)
            except RunRecordError:
                bad.append(p)
        return bad

    def set_aside_unreadable(self, candidates_per_round: int) -> list[Path]:
        """Rename unreadable attempts to ``*.json.corrupt``, and every attempt of a later round (its prompt
        was built from the lost one) to ``*.json.superseded``, so a resume redoes them; returns the files
        moved."""
        bad = self.unreadable_attempts()
        if not bad:
            return []
        first_round = min((int(p.stem) - 1) // candidates_per_round + 1 for p in bad)
        later = [p for p in self.attempt_files() if p not in bad and int(p.stem) > first_round
                 * candidates_per_round]
        for p, suffix in [*((p, ".corrupt") for p in bad), *((p, ".superseded") for p in later)]:
            p.rename(p.with_name(p.name + suffix))
        return [*bad, *later]

    def summary(self) -> RunSummary | None:
        path = self.run_dir / SUMMARY
        return _load(path, RunSummary) if path.exists() else None

    def best_code(self) -> str | None:
        path = self.run_dir / BEST
        return path.read_text() if path.exists() else None


# --------------------------------------------------------------------------------------------------
# Reading, tolerantly


@dataclass(frozen=True)
class Problem:
    """A file that could not be read, and why."""

    file: str
    message: str

    @classmethod
    def of(cls, exc: UnreadableRecord) -> Problem:
        return cls(str(exc.path), exc.reason)

    def __str__(self) -> str:
        return f"{self.file}: {self.message}"


@dataclass
class RunFiles:
    """One run directory as far as it could be read."""

    dir: Path
    header: RunHeader | None
    summary: RunSummary | None
    attempts: list[Attempt]
    best_code: str | None
    problems: list[Problem] = field(default_factory=list)
    #: Who the run's writer lock names (None: no lock), and whether that writer still runs.
    lock: Holder | None = None
    writer_alive: bool = False

    @property
    def name(self) -> str:
        return self.dir.name

    @property
    def how_to_resume(self) -> str | None:
        """How to continue the run, when its status leaves something to do and no one is writing it."""
        status = self.effective_summary().status
        return resume_command(self.dir) if status in RESUMABLE and not self.writer_alive else None

    def effective_summary(self) -> RunSummary:
        """The run's summary, or one rolled up from the attempts when summary.json is missing or unreadable.

        ``cost_known`` also looks at the attempts: summaries written before the field existed lack it.
        """
        if self.summary is not None:
            known = self.summary.cost_known and all(a.usage.price_known for a in self.attempts)
            summary = self.summary if known else self.summary.model_copy(update={"cost_known": False})
            return self._honest(summary)
        start = self.header.created if self.header else None
        first = min((a for a in self.attempts if a.passed), key=lambda a: a.finished, default=None)
        estimated = RunSummary(
            status="running",
            stop_reason="no readable summary.json; figures rolled up from the attempts",
            wall_seconds=_seconds(start, max((a.finished for a in self.attempts), default=None)) or 0.0,
            seconds_to_first_correct=_seconds(start, first.finished) if first else None,
        )
        return self._honest(rolled_up(estimated, self.attempts))

    def _honest(self, summary: RunSummary) -> RunSummary:
        """``running`` only while its writer runs: a run whose writer is gone (killed, its machine down) was
        interrupted, and says how to resume it."""
        if summary.status != "running" or self.writer_alive:
            return summary
        who = f"its writer ({self.lock.describe()}) is gone" if self.lock else "no process is writing it"
        reason = f"{who}, killed or lost before it could record why; resume with: {resume_command(self.dir)}"
        if summary.stop_reason:  # what the estimate says of itself
            reason = f"{summary.stop_reason}; {reason}"
        return summary.model_copy(update={"status": "interrupted", "stop_reason": reason})

    def as_json(self) -> dict[str, Any]:
        """Everything read, as JSON-ready data (``show --format json``, the viewer's run page twin)."""
        return {
            "dir": self.name,
            "header": self.header.model_dump(mode="json") if self.header else None,
            "summary": self.effective_summary().model_dump(mode="json"),
            "summary_from_file": self.summary is not None,
            "writer": {"pid": self.lock.pid, "host": self.lock.host, "heartbeat": self.lock.heartbeat}
            if self.lock and self.writer_alive else None,
            "resume_command": self.how_to_resume,
            "attempts": [a.model_dump(mode="json") for a in self.attempts],
            "best_code": self.best_code,
            "problems": [{"file": p.file, "message": p.message} for p in self.problems],
        }

    def first_correct_attempt(self) -> int | None:
        return min((a.index for a in self.attempts if a.passed), default=None)

    def attempt(self, index: int) -> Attempt | None:
        return next((a for a in self.attempts if a.index == index), None)


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    try:
        return max(0.0, (end - start).total_seconds())
    except TypeError:  # one aware, one naive
        return None


def read_run(run_dir: Path) -> RunFiles:
    """Read a run directory; unreadable files become problems, the rest is kept."""
    problems: list[Problem] = []

    def load(path: Path, model: type[M]) -> M | None:
        try:
            return read_json_record(path, model)
        except UnreadableRecord as exc:
            problems.append(Problem.of(exc))
            return None

    header = None
    if (run_dir / HEADER).exists():
        header = load(run_dir / HEADER, RunHeader)
    else:
        problems.append(Problem(str(run_dir / HEADER), "missing (empty or incomplete run directory)"))
    summary = load(run_dir / SUMMARY, RunSummary) if (run_dir / SUMMARY).exists() else None
    attempts: dict[int, Attempt] = {}
    for p in attempt_files(run_dir):
        a = load(p, Attempt)
        if a is None:
            continue
        if a.index in attempts:
            problems.append(Problem(str(p), f"repeats attempt index {a.index}; ignored"))
            continue
        attempts[a.index] = a
    best_code = None
    if (run_dir / BEST).exists():
        try:
            best_code = read_record_text(run_dir / BEST)
        except UnreadableRecord as exc:
            problems.append(Problem.of(exc))
    lock = read_holder(run_dir / LOCK)
    return RunFiles(run_dir, header, summary, [attempts[i] for i in sorted(attempts)], best_code, problems,
                    lock, writer_alive(run_dir))


# --------------------------------------------------------------------------------------------------
# The summary roll-up


def rolled_up(summary: RunSummary, attempts: Sequence[Attempt]) -> RunSummary:
    """``summary`` with every figure that follows from the attempts recomputed: counts, the best and its
    speed, outcomes, tokens and cost. Status, stop reason and times are the caller's: the agent knows them as
    it runs, a reader without summary.json estimates them from the timestamps."""
    best = best_attempt(attempts)
    timing = best.timing if best else {}
    return summary.model_copy(update={
        "rounds": max((a.round for a in attempts), default=0),
        "attempts": len(attempts),
        "passes": sum(a.passed for a in attempts),
        "best_attempt": best.index if best else None,
        "best_time_us": attempt_time_us(best) if best else None,
        "speedup_vs_human": timing.get("speedup_vs_human"),
        "speedup_vs_cublas": timing.get("speedup_vs_cublas"),
        "sol_fraction": timing.get("sol_fraction"),
        "estimate_sol_fraction": (estimate_sol_fraction(best) if best and attempt_time_us(best) is None
                                  else None),
        "outcomes": dict(Counter(a.outcome.value for a in attempts)),
        "input_tokens": sum(a.usage.input_tokens for a in attempts),
        "output_tokens": sum(a.usage.output_tokens for a in attempts),
        "cost_usd": round(sum(a.usage.cost_usd for a in attempts), 6),
        "cost_known": all(a.usage.price_known for a in attempts),
    })
