"""The SQLite index over run records and bench results: a cache, rebuildable from the JSON at any time.

The JSON files are the truth (``runs/<ts>_<task>_<id>/``, ``bench/results/*.json``); ``runs/index.db``
only makes queries (leaderboard, viewer) fast. ``Index.refresh()`` re-reads the sources whose files
changed (size + mtime signature; for a run, also whether its writer lives) and drops vanished ones;
``Index.rebuild()`` forgets everything and re-reads it all. A file that cannot be read becomes a row in
``problems`` naming it, never a crash.

The schema evolves through ``MIGRATIONS``, an append-only list applied in order and tracked by SQLite's
``PRAGMA user_version``. A migration that adds derived data marks every source stale, so the next
refresh re-reads the JSON and the new columns are filled for old runs too. An index written by a newer
coda-agent, or one that is not a database at all, is simply recreated: nothing in it is irreplaceable.

Runs are read with the tolerant run-directory reader (``rundir.read_run``), timings with
``timings.timing_points``: the index holds what those say, so it agrees with ``show`` and the viewer.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TypeVar

from ..bench.results import E2E_SUFFIX, BenchRun, holds_no_rows
from ..verifier.verdict import GPU_OOM_MARK
from .records import UnreadableRecord, read_json_record
from .rundir import Problem, RunFiles, iter_run_dirs, read_run, record_files, writer_alive
from .timings import TimingPoint, positive, timing_points

T = TypeVar("T")

INDEX_NAME = "index.db"


@dataclass(frozen=True)
class Migration:
    name: str
    sql: str
    reindex: bool = False  # adds derived data: every source must be read again


MIGRATIONS: list[Migration] = [
    Migration(
        "m001_initial",
        """
        CREATE TABLE sources (path TEXT PRIMARY KEY, kind TEXT NOT NULL, signature TEXT NOT NULL);
        CREATE TABLE problems (source TEXT NOT NULL, file TEXT NOT NULL, message TEXT NOT NULL);
        CREATE TABLE runs (
            dir TEXT PRIMARY KEY, run_id TEXT NOT NULL, task TEXT NOT NULL, task_version INTEGER NOT NULL,
            model TEXT NOT NULL, device TEXT NOT NULL, host TEXT, created TEXT NOT NULL,
            status TEXT NOT NULL, stop_reason TEXT, rounds INTEGER, attempts INTEGER, passes INTEGER,
            best_attempt INTEGER, best_time_us REAL, input_tokens INTEGER, output_tokens INTEGER,
            cost_usd REAL, wall_seconds REAL, seconds_to_first_correct REAL,
            verifier_stages TEXT, params TEXT, git_commit TEXT, git_dirty INTEGER
        );
        CREATE INDEX runs_task ON runs (task, task_version, device);
        CREATE TABLE attempts (
            run_dir TEXT NOT NULL, idx INTEGER NOT NULL, round INTEGER, slot INTEGER,
            started TEXT, finished TEXT, outcome TEXT NOT NULL, passed INTEGER NOT NULL, reason TEXT,
            input_tokens INTEGER, output_tokens INTEGER, cost_usd REAL,
            llm_seconds REAL, verify_seconds REAL,
            PRIMARY KEY (run_dir, idx)
        );
        CREATE TABLE bench_runs (
            path TEXT PRIMARY KEY, created TEXT NOT NULL, device TEXT NOT NULL, command TEXT, driver TEXT,
            git_commit TEXT, timing_method TEXT, peak_tflops_bf16 REAL, peak_hbm_tbps REAL
        );
        CREATE TABLE bench_rows (
            bench_path TEXT NOT NULL, row INTEGER NOT NULL, task TEXT NOT NULL, task_version INTEGER NOT NULL,
            shape TEXT NOT NULL, author TEXT NOT NULL, correct INTEGER NOT NULL, verdict_reason TEXT,
            candidate_us REAL, eager_us REAL, compiled_us REAL, cublas_us REAL, sol_us REAL,
            flops REAL, min_bytes REAL, launches INTEGER,
            PRIMARY KEY (bench_path, row)
        );
        CREATE INDEX bench_rows_task ON bench_rows (task, task_version);
        """,
    ),
    Migration(
        "m002_attempt_timings",
        """
        CREATE TABLE attempt_timings (
            run_dir TEXT NOT NULL, idx INTEGER NOT NULL, shape TEXT, median_us REAL NOT NULL,
            human_us REAL, sol_us REAL, eager_us REAL, compiled_us REAL, cublas_us REAL
        );
        CREATE INDEX attempt_timings_run ON attempt_timings (run_dir);
        ALTER TABLE runs ADD COLUMN first_correct_attempt INTEGER;
        ALTER TABLE runs ADD COLUMN human_timing TEXT;
        """,
        reindex=True,
    ),
    # Unpriced runs and attempts get a NULL cost (shown "unpriced"), no longer $0: every run is read again.
    Migration("m003_unpriced_cost_is_null", "", reindex=True),
    # A replay (``replay/<run>``) is listed under the model that wrote the replies: every run is read again.
    Migration("m004_replay_of", "ALTER TABLE runs ADD COLUMN replay_of TEXT", reindex=True),
    # A task's identity is its content: two different tasks under one name are ranked apart.
    Migration(
        "m005_task_hash",
        """
        ALTER TABLE runs ADD COLUMN task_hash TEXT;
        ALTER TABLE runs ADD COLUMN task_path TEXT;
        ALTER TABLE bench_rows ADD COLUMN task_hash TEXT;
        """,
        reindex=True,
    ),
    # A run whose writer is gone reads as interrupted, no longer running: every run is read again.
    Migration("m006_writer_gone_is_interrupted", "", reindex=True),
]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection, upto: int | None = None) -> int:
    """Apply the pending migrations (up to ``upto``, default all) in one transaction; return the version.

    The version is read inside ``BEGIN IMMEDIATE``, so two processes opening an old index at once
    cannot both apply the same step. ``conn`` must be in autocommit mode (``isolation_level=None``).
    """
    target = SCHEMA_VERSION if upto is None else upto
    with _Transaction(conn):
        current = conn.execute("PRAGMA user_version").fetchone()[0]
        for version in range(current + 1, target + 1):
            m = MIGRATIONS[version - 1]
            for statement in filter(str.strip, m.sql.split(";")):
                conn.execute(statement)
            if m.reindex:
                conn.execute("DELETE FROM sources")
            conn.execute(f"PRAGMA user_version = {version}")
    return max(current, target)


# --------------------------------------------------------------------------------------------------
# The index


@dataclass(frozen=True)
class RunRow:
    """One run as the index holds it."""

    dir: str
    run_id: str
    task: str
    task_version: int
    model: str
    device: str
    host: str | None
    created: str
    status: str
    stop_reason: str | None
    rounds: int | None
    attempts: int | None
    passes: int | None
    best_attempt: int | None
    best_time_us: float | None
    input_tokens: int | None
    output_tokens: int | None
    cost_usd: float | None
    wall_seconds: float | None
    seconds_to_first_correct: float | None
    verifier_stages: str | None
    params: str | None
    git_commit: str | None
    git_dirty: int | None
    first_correct_attempt: int | None
    human_timing: str | None  # JSON: shape -> µs of the human kernel timed in this run's session
    replay_of: str | None = None  # a replay: the run whose replies it served (``model`` is that run's model)
    task_hash: str | None = None  # the task's content hash; None in runs recorded before it
    task_path: str | None = None

    def human_us(self) -> dict[str, float]:
        data = json.loads(self.human_timing) if self.human_timing else {}
        return {str(k): v for k, v in data.items() if positive(v) is not None}

    @property
    def tokens(self) -> int:
        return (self.input_tokens or 0) + (self.output_tokens or 0)

    @property
    def cost_known(self) -> bool:
        """False for a run of a model with no known price: the index stores its cost as NULL."""
        return self.cost_usd is not None


@dataclass(frozen=True)
class BenchRowRecord:
    """One bench row joined with its bench run (device, date)."""

    bench_path: str
    created: str
    device: str
    task: str
    task_version: int
    shape: str
    author: str
    correct: bool
    verdict_reason: str | None
    candidate_us: float | None
    eager_us: float | None
    compiled_us: float | None
    cublas_us: float | None
    sol_us: float | None
    flops: float | None
    min_bytes: float | None
    launches: int | None
    task_hash: str | None = None  # the task's content hash; None in results recorded before it

    @property
    def conclusive(self) -> bool:
        """A finding about the kernel: a time, or a failure of its own. A correct row not timed yet, or one
        that failed because the GPU ran out of memory (shared with other checks), says nothing new."""
        if self.correct:
            return self.candidate_us is not None
        return GPU_OOM_MARK not in (self.verdict_reason or "")


@dataclass(frozen=True)
class AttemptTiming:
    run_dir: str
    idx: int
    shape: str | None
    median_us: float
    human_us: float | None
    sol_us: float | None
    eager_us: float | None
    compiled_us: float | None
    cublas_us: float | None


@dataclass
class RefreshStats:
    indexed: int = 0
    unchanged: int = 0
    removed: int = 0

    def __str__(self) -> str:
        return f"{self.indexed} read, {self.unchanged} unchanged, {self.removed} removed"


def _signature(files: list[Path]) -> str:
    h = hashlib.sha1()
    for f in files:
        try:
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{f.name}:gone\n".encode())
    return h.hexdigest()


REPLAY_PREFIX = "replay/"


def replayed_model(model: str, runs_dir: Path) -> tuple[str, str | None]:
    """The author of a run's replies, and for a replay the run it replayed.

    A replay run records its model as ``replay/<path of the replayed run>``; its replies were written by that
    run's model, so that is its author (followed through replays of replays). When the replayed run is no
    longer on disk (here, or under its name in ``runs_dir``), the author is ``replay of <name>``.
    """
    seen: set[str] = set()
    origin: str | None = None
    while model.startswith(REPLAY_PREFIX) and model not in seen:
        seen.add(model)
        path = Path(model[len(REPLAY_PREFIX):])
        origin = origin or path.name
        header = next((d / "header.json" for d in (path, runs_dir / path.name)
                       if (d / "header.json").is_file()), None)
        try:
            recorded = json.loads(header.read_text()).get("model") if header else None
        except (OSError, ValueError):
            recorded = None
        if not isinstance(recorded, str) or not recorded:
            return f"replay of {origin}", origin
        model = recorded
    return model, origin


def _norm_device(device: str) -> str:
    return " ".join(device.split())


def _row(cls: type[T], row: sqlite3.Row) -> T:
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]  # T is always a dataclass here
    columns = row.keys()  # iterating a Row yields values, not names
    return cls(**{k: row[k] for k in columns if k in names})


class Index:
    """An open index: ``with Index.open(runs_dir, bench_dir) as ix: ix.refresh(); ix.runs()``."""

    def __init__(self, conn: sqlite3.Connection, runs_dir: Path, bench_dir: Path | None,
                 path: Path | None) -> None:
        self.conn = conn
        self.runs_dir = runs_dir
        self.bench_dir = bench_dir
        self.path = path

    @classmethod
    def open(cls, runs_dir: Path, bench_dir: Path | None = None, db_path: Path | None = None) -> Index:
        """Open (creating or migrating) the index; in memory when the runs folder does not exist or the
        index file cannot be written (a read-only results folder): it is only a cache."""
        if db_path is None and runs_dir.is_dir():
            db_path = runs_dir / INDEX_NAME
        conn = None
        if db_path is not None:
            try:
                conn = _connect(db_path)
            except sqlite3.OperationalError:
                db_path = None
        if conn is None:
            conn = sqlite3.connect(":memory:", isolation_level=None)
            migrate(conn)
        conn.row_factory = sqlite3.Row
        return cls(conn, runs_dir, bench_dir, db_path)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writing

    def rebuild(self) -> RefreshStats:
        """Forget everything and read all sources again (in one transaction: readers never see it
        half-done)."""
        return self.refresh(full=True)

    def refresh(self, *, full: bool = False) -> RefreshStats:
        """Bring the index up to date with the files: read changed sources, drop vanished ones."""
        stats = RefreshStats()
        found: dict[str, tuple[str, Path, str]] = {}  # key -> (kind, path, signature)
        for d in iter_run_dirs(self.runs_dir):
            # a run's status also turns on whether its writer lives (``running`` or ``interrupted``), which no
            # file says
            live = ":writing" if writer_alive(d) else ""
            found[f"run:{d.name}"] = ("run", d, _signature(record_files(d)) + live)
        if self.bench_dir is not None and self.bench_dir.is_dir():
            for f in sorted(self.bench_dir.glob("*.json")):
                if f.name.endswith(E2E_SUFFIX + ".json"):  # an end-to-end run: no per-task rows to rank
                    continue
                found[f"bench:{f}"] = ("bench", f, _signature([f]))
        with self._transaction():  # read and write under one lock: concurrent refreshes cannot interleave
            if full:
                for table in ("sources", "problems", "runs", "attempts", "attempt_timings", "bench_runs",
                              "bench_rows"):
                    self.conn.execute(f"DELETE FROM {table}")
            known = {r["path"]: r["signature"] for r in self.conn.execute("SELECT path, signature FROM "
                                                                          "sources")}
            for key in known.keys() - found.keys():
                self._forget(key)
                stats.removed += 1
            for key, (kind, path, sig) in found.items():
                if known.get(key) == sig:
                    stats.unchanged += 1
                    continue
                self._forget(key)
                if kind == "run":
                    self._index_run(key, read_run(path))
                else:
                    self._index_bench(key, path)
                self._insert("sources", ("path", "kind", "signature"), [(key, kind, sig)])
                stats.indexed += 1
        return stats

    def _insert(self, table: str, columns: tuple[str, ...], rows: list[tuple[object, ...]]) -> None:
        """Insert rows by column name (a table grown by ALTER TABLE keeps its meaning)."""
        marks = ",".join("?" * len(columns))
        self.conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)

    def _forget(self, key: str) -> None:
        kind, _, name = key.partition(":")
        self.conn.execute("DELETE FROM sources WHERE path = ?", (key,))
        self.conn.execute("DELETE FROM problems WHERE source = ?", (key,))
        if kind == "run":
            for table in ("runs", "attempts", "attempt_timings"):
                col = "dir" if table == "runs" else "run_dir"
                self.conn.execute(f"DELETE FROM {table} WHERE {col} = ?", (name,))
        else:
            self.conn.execute("DELETE FROM bench_runs WHERE path = ?", (name,))
            self.conn.execute("DELETE FROM bench_rows WHERE bench_path = ?", (name,))

    def _note(self, key: str, problems: list[Problem]) -> None:
        self._insert("problems", ("source", "file", "message"), [(key, p.file, p.message) for p in problems])

    def _index_run(self, key: str, run: RunFiles) -> None:
        self._note(key, run.problems)
        h = run.header
        if h is None:
            return
        s = run.effective_summary()
        model, replay_of = replayed_model(h.model, self.runs_dir)
        self._insert(
            "runs",
            ("dir", "run_id", "task", "task_version", "model", "device", "host", "created", "status",
             "stop_reason", "rounds", "attempts", "passes", "best_attempt", "best_time_us", "input_tokens",
             "output_tokens", "cost_usd", "wall_seconds", "seconds_to_first_correct", "verifier_stages",
             "params", "git_commit", "git_dirty", "first_correct_attempt", "human_timing", "replay_of",
             "task_hash", "task_path"),
            [(
                run.name, h.run_id, h.task, h.task_version, model, _norm_device(h.device), h.host,
                h.created.isoformat(), s.status, s.stop_reason, s.rounds, s.attempts, s.passes,
                s.best_attempt, s.best_time_us, s.input_tokens, s.output_tokens,
                s.cost_usd if s.cost_known else None, s.wall_seconds, s.seconds_to_first_correct,
                json.dumps(h.verifier_stages), json.dumps(h.params, default=str), h.git_commit,
                int(h.git_dirty), run.first_correct_attempt(),
                json.dumps(getattr(h, "human_timing", None) or {}), replay_of, h.task_hash, h.task_path,
            )],
        )
        for a in run.attempts:
            reason = a.reason
            self._insert(
                "attempts",
                ("run_dir", "idx", "round", "slot", "started", "finished", "outcome", "passed", "reason",
                 "input_tokens", "output_tokens", "cost_usd", "llm_seconds", "verify_seconds"),
                [(
                    run.name, a.index, a.round, a.slot, a.started.isoformat(), a.finished.isoformat(),
                    a.outcome, int(a.passed), reason, a.usage.input_tokens, a.usage.output_tokens,
                    a.usage.cost_usd if a.usage.price_known else None,
                    a.durations.get("llm"), a.durations.get("verify"),
                )],
            )
            points = timing_points(a.timing) if a.passed else {}
            best_us = positive(s.best_time_us)
            if a.passed and not points and a.index == s.best_attempt and best_us is not None:
                points = {None: TimingPoint(best_us)}  # a figure without its shape: shown, never compared
            self._insert(
                "attempt_timings",
                ("run_dir", "idx", "shape", "median_us", "human_us", "sol_us", "eager_us", "compiled_us",
                 "cublas_us"),
                [
                    (run.name, a.index, k, p.median_us, p.human_us, p.sol_us, p.eager_us, p.compiled_us,
                     p.cublas_us)
                    for k, p in points.items()
                ],
            )

    def _index_bench(self, key: str, path: Path) -> None:
        try:
            bench = read_json_record(path, BenchRun)
        except UnreadableRecord as exc:
            # a tune search, a probe's or the acceptance phase's record beside the results has no rows to
            # rank: not a problem
            if not holds_no_rows(path):
                self._note(key, [Problem.of(exc)])
            return
        name = str(path)
        self._insert(
            "bench_runs",
            ("path", "created", "device", "command", "driver", "git_commit", "timing_method",
             "peak_tflops_bf16", "peak_hbm_tbps"),
            [(
                name, bench.created.isoformat(), _norm_device(bench.device), bench.command, bench.driver,
                bench.git_commit, bench.timing_method, bench.peak_tflops_bf16, bench.peak_hbm_tbps,
            )],
        )
        us = lambda t: t.median_us if t is not None else None  # noqa: E731
        self._insert(
            "bench_rows",
            ("bench_path", "row", "task", "task_version", "task_hash", "shape", "author", "correct",
             "verdict_reason", "candidate_us", "eager_us", "compiled_us", "cublas_us", "sol_us", "flops",
             "min_bytes", "launches"),
            [
                (
                    name, i, r.task, r.task_version, r.task_hash, r.shape, r.author, int(r.correct),
                    r.verdict_reason, us(r.candidate), us(r.eager), us(r.compiled), us(r.cublas), r.sol_us,
                    r.flops, r.min_bytes, r.launches,
                )
                for i, r in enumerate(bench.rows)
            ],
        )

    def _transaction(self) -> _Transaction:
        return _Transaction(self.conn)

    # ---- reading

    def runs(self, task: str | None = None) -> list[RunRow]:
        sql = "SELECT * FROM runs"
        args: tuple[str, ...] = ()
        if task is not None:
            sql, args = sql + " WHERE task = ?", (task,)
        return [_row(RunRow, r) for r in self.conn.execute(sql + " ORDER BY created, dir", args)]

    def run(self, dir_name: str) -> RunRow | None:
        r = self.conn.execute("SELECT * FROM runs WHERE dir = ?", (dir_name,)).fetchone()
        return _row(RunRow, r) if r else None

    def attempt_timings(self, task: str | None = None) -> list[AttemptTiming]:
        sql = "SELECT t.* FROM attempt_timings t JOIN runs r ON r.dir = t.run_dir"
        rows = self.conn.execute(sql + (" WHERE r.task = ?" if task else ""), (task,) if task else ())
        return [_row(AttemptTiming, r) for r in rows]

    def bench_rows(self, task: str | None = None) -> list[BenchRowRecord]:
        sql = "SELECT b.*, r.created, r.device FROM bench_rows b JOIN bench_runs r ON r.path = b.bench_path"
        rows = self.conn.execute(
            sql + (" WHERE b.task = ?" if task else "") + " ORDER BY r.created, b.bench_path, b.row",
            (task,) if task else (),
        )
        return [replace(rec, correct=bool(rec.correct)) for rec in (_row(BenchRowRecord, r) for r in rows)]

    def tasks(self) -> list[str]:
        rows = self.conn.execute("SELECT task FROM runs UNION SELECT task FROM bench_rows ORDER BY task")
        return [r[0] for r in rows]

    def problems(self) -> list[Problem]:
        return [Problem(r["file"],
                        r["message"]) for r in self.conn.execute("SELECT * FROM problems ORDER BY file")]


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error), for a connection in autocommit mode."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")


def _open_migrated(db_path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db_path, isolation_level=None, timeout=30)
    try:
        conn.execute("PRAGMA journal_mode = WAL")  # the viewer reads while a CLI refreshes
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"index schema {version} is newer than this coda-agent's")
        migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _connect(db_path: Path) -> sqlite3.Connection:
    """Open and migrate the index file; recreate it if it is not a database or from a newer schema."""
    try:
        return _open_migrated(db_path)
    except sqlite3.OperationalError:  # locked, read-only, disk full: a real error, keep the file
        raise
    except sqlite3.DatabaseError:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db_path}{suffix}").unlink(missing_ok=True)
        return _open_migrated(db_path)
