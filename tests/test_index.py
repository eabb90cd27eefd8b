"""The SQLite index: rebuild from the JSON, incremental refresh, migrations, tolerance of bad files."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from datetime import timedelta

import pytest

from coda_agent.store.index import MIGRATIONS, SCHEMA_VERSION, Index, migrate
from coda_agent.store.timings import TimingPoint, timing_points

from .records_factory import H200, T0, bench_row, make_bench, make_run

TABLES = ("runs", "attempts", "attempt_timings", "bench_runs", "bench_rows", "problems")


def dump(ix: Index) -> dict[str, list[tuple]]:
    """Every indexed row, in a stable order (to compare two indexes)."""
    return {t: sorted(tuple(r) for r in ix.conn.execute(f"SELECT * FROM {t}")) for t in TABLES}


@pytest.fixture
def store(tmp_path):
    runs, bench = tmp_path / "runs", tmp_path / "bench"
    a = make_run(runs, model="anthropic/claude-sonnet-4-5",
                 outcomes=("compile_error", "wrong_output", "passed"),
                 times={"llama3-8b": 104.0, "coda-block": 310.0})
    b = make_run(runs, model="openai/gpt-5", outcomes=("no_code", "passed"), times={"llama3-8b": 96.0},
                 session={"llama3-8b": {"human_us": 101.0, "eager": 210.0, "compiled": 150.0, "cublas": 97.0,
                                        "sol_us": 70.0}}, created=T0 + timedelta(hours=1))
    make_bench(bench,
               [bench_row("gemm_rmsnorm", "llama3-8b", 100.0),
                bench_row("gemm_rmsnorm", "coda-block", 300.0)])
    return runs, bench, a, b


def test_rebuild_indexes_runs_attempts_timings_and_bench(store):
    runs, bench, a, b = store
    with Index.open(runs, bench) as ix:
        stats = ix.rebuild()
        assert (stats.indexed, stats.removed) == (3, 0)
        assert ix.path == runs / "index.db" and ix.path.exists()
        rows = {r.model: r for r in ix.runs()}
        claude = rows["anthropic/claude-sonnet-4-5"]
        assert ((claude.dir, claude.task, claude.task_version, claude.device)
                == (a.name, "gemm_rmsnorm", 1, H200))
        assert (claude.attempts, claude.passes, claude.first_correct_attempt, claude.rounds) == (3, 1, 3, 3)
        assert claude.tokens == 3 * 3800 and claude.cost_usd == pytest.approx(0.15)
        assert rows["openai/gpt-5"].human_us() == {"llama3-8b": 101.0}
        outcomes = [r["outcome"]
                    for r in ix.conn.execute("SELECT outcome FROM attempts WHERE run_dir = ? ORDER BY idx",
                                                          (a.name,))]
        assert outcomes == ["compile_error", "wrong_output", "passed"]
        timings = {(t.run_dir, t.shape): t for t in ix.attempt_timings()}
        assert timings[(a.name, "coda-block")].median_us == 310.0 and timings[(a.name, "coda-block")].idx == 3
        gpt = timings[(b.name, "llama3-8b")]
        assert (gpt.median_us, gpt.human_us, gpt.eager_us, gpt.compiled_us, gpt.cublas_us, gpt.sol_us) == (
            96.0, 101.0, 210.0, 150.0, 97.0, 70.0)
        rows_b = ix.bench_rows("gemm_rmsnorm")
        assert [(r.shape, r.author, r.candidate_us, r.eager_us, r.device) for r in rows_b] == [
            ("llama3-8b", "human", 100.0, 200.0, H200), ("coda-block", "human", 300.0, 200.0, H200)]
        assert ix.tasks() == ["gemm_rmsnorm"] and ix.problems() == []


def test_refresh_reads_only_what_changed_and_matches_a_rebuild(store, tmp_path):
    runs, bench, a, b = store
    with Index.open(runs, bench) as ix:
        ix.refresh()
        assert ix.refresh().unchanged == 3
        # a run in progress gains an attempt, another run is deleted, a new one appears
        shutil.copy(a / "attempts" / "0003.json", a / "attempts" / "0004.json")
        text = (a / "attempts" / "0004.json").read_text().replace('"index": 3', '"index": 4')
        (a / "attempts" / "0004.json").write_text(text)
        shutil.rmtree(b)
        make_run(runs, model="openai/o3", outcomes=("passed",), times={"llama3-8b": 90.0},
                 created=T0 + timedelta(days=1))
        stats = ix.refresh()
        assert (stats.indexed, stats.removed, stats.unchanged) == (2, 1, 1)
        assert {r.model for r in ix.runs()} == {"anthropic/claude-sonnet-4-5", "openai/o3"}
        assert (ix.conn.execute("SELECT count(*) FROM attempts WHERE run_dir = ?", (a.name,)).fetchone()[0]
                == 4)
        incremental = dump(ix)
    with Index.open(runs, bench, db_path=tmp_path / "fresh.db") as fresh:
        fresh.rebuild()
        assert dump(fresh) == incremental


def test_rebuild_forgets_rows_of_files_changed_behind_the_signature(store):
    """Same size and mtime after an edit: refresh cannot see it, rebuild always does."""
    runs, bench, a, _ = store
    with Index.open(runs, bench) as ix:
        ix.refresh()
        header = a / "header.json"
        st = header.stat()
        header.write_text(
            header.read_text().replace("anthropic/claude-sonnet-4-5", "anthropic/claude-sonnet-4-X"))
        os.utime(header, ns=(st.st_atime_ns, st.st_mtime_ns))
        ix.refresh()
        assert "anthropic/claude-sonnet-4-X" not in {r.model for r in ix.runs()}
        ix.rebuild()
        assert "anthropic/claude-sonnet-4-X" in {r.model for r in ix.runs()}


def test_migration_from_schema_1_keeps_working_and_fills_new_data(store):
    runs, bench, a, _ = store
    db = runs / "index.db"
    conn = sqlite3.connect(db, isolation_level=None)
    assert migrate(conn, upto=1) == 1
    # what a version-1 coda-agent had written: a run row and its source signature
    conn.execute(
        "INSERT INTO runs (dir, run_id, task, task_version, model, device, created, status) VALUES "
        "(?,?,?,?,?,?,?,?)",
        (a.name, "old", "gemm_rmsnorm", 1, "anthropic/claude-sonnet-4-5", H200, T0.isoformat(), "completed"),
    )
    conn.execute("INSERT INTO sources VALUES (?, 'run', 'stale-signature')", (f"run:{a.name}",))
    assert ({r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            >= {"runs", "sources"})
    assert "attempt_timings" not in {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()

    with Index.open(runs, bench) as ix:
        assert ix.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == len(MIGRATIONS)
        stats = ix.refresh()
        assert stats.indexed == 3  # the migration marked every source stale: all read again
        rows = [r for r in ix.runs() if r.dir == a.name]
        assert len(rows) == 1 and rows[0].run_id != "old" and rows[0].first_correct_attempt == 3
        assert {t.shape for t in ix.attempt_timings() if t.run_dir == a.name} == {"llama3-8b", "coda-block"}


@pytest.mark.parametrize("content", [b"this is not a database, just text" * 100, b""])
def test_unreadable_or_newer_index_is_recreated(store, content):
    runs, bench, *_ = store
    (runs / "index.db").write_bytes(content)
    with Index.open(runs, bench) as ix:
        ix.refresh()
        assert len(ix.runs()) == 2
    conn = sqlite3.connect(runs / "index.db")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.close()
    with Index.open(runs, bench) as ix:
        assert ix.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        ix.refresh()
        assert len(ix.runs()) == 2


def test_an_index_file_that_cannot_be_opened_falls_back_to_memory(store, tmp_path):
    runs, bench, *_ = store
    # as in a read-only results folder: sqlite cannot open it
    unwritable = tmp_path / "no-such-folder" / "index.db"
    with Index.open(runs, bench, db_path=unwritable) as ix:
        assert ix.path is None
        ix.refresh()
        assert len(ix.runs()) == 2 and ix.problems() == []


def test_missing_runs_folder_gives_an_in_memory_index(tmp_path):
    with Index.open(tmp_path / "nothing-here", tmp_path / "no-bench") as ix:
        ix.refresh()
        assert ix.path is None and ix.runs() == [] and ix.tasks() == []
    assert not (tmp_path / "nothing-here").exists()


def test_bad_files_are_named_and_the_rest_is_indexed(store):
    runs, bench, a, b = store
    (b / "summary.json").write_text('{"status": "exploded"}')  # schema-invalid: rolled up from attempts
    (a / "attempts" / "0002.json").write_text("")  # empty attempt file
    broken = runs / "20260502-000000_gemm_rmsnorm_broken"
    (broken / "attempts").mkdir(parents=True)
    (broken / "header.json").write_text("{not json")
    (runs / "20260503-000000_empty").mkdir()
    (bench / "broken.json").write_text('{"created": "2026-05-01T00:00:00", "rows": []}')
    with Index.open(runs, bench) as ix:
        ix.rebuild()
        problems = {os.path.relpath(p.file, runs.parent): p.message for p in ix.problems()}
        assert problems[f"runs/{b.name}/summary.json"].startswith("does not match the schema: status")
        assert problems[f"runs/{a.name}/attempts/0002.json"] == "empty file"
        assert problems[f"runs/{broken.name}/header.json"].startswith("invalid JSON (Expecting property name")
        assert problems["runs/20260503-000000_empty/header.json"].startswith("missing")
        assert "command: Field required" in problems["bench/broken.json"]
        rows = {r.dir: r for r in ix.runs()}
        assert set(rows) == {a.name, b.name}
        assert rows[a.name].attempts == 3  # summary.json still says 3; attempt 2 is simply absent below
        assert (ix.conn.execute("SELECT count(*) FROM attempts WHERE run_dir = ?", (a.name,)).fetchone()[0]
                == 2)
        rolled = rows[b.name]  # no valid summary: figures from the attempts; no writer, so not running
        assert ((rolled.attempts, rolled.passes, rolled.best_attempt, rolled.status)
                == (2, 1, 2, "interrupted"))
        assert (rolled.best_time_us == pytest.approx(96.0)
                and rolled.seconds_to_first_correct == pytest.approx(50.0))
        # fixing a file clears its problem on the next refresh
        (bench / "broken.json").unlink()
        ix.refresh()
        assert not any(p.file.endswith("broken.json") for p in ix.problems())


def test_tune_reports_and_end_to_end_runs_beside_the_bench_are_skipped_not_unreadable(store):
    """``bench --tune --json`` and ``bench-e2e`` write next to the suite bench's results; neither has rows to
    rank."""
    runs, bench, *_ = store
    (bench / "h200-tune.json").write_text(json.dumps({"date": "2026-12-03", "budget_s": 50, "tasks": {}}))
    (bench / "h200-2026-12-03-e2e.json").write_text(json.dumps({"schema_version": 1}))
    # the acceptance phase's checks (a list) and a probe's record (no rows): 21 such files read as
    # unreadable on every leaderboard of a checkout (a manual seat)
    (bench / "h200-2026-12-06-a-accept.json").write_text(json.dumps([{"task": "t", "ok": True}]))
    (bench / "h100-2026-12-07-a-host-ops.json").write_text(json.dumps({"ops": {}}))
    with Index.open(runs, bench) as ix:
        ix.rebuild()
        assert ix.problems() == [] and ix.conn.execute("SELECT count(*) FROM bench_runs").fetchone()[0] == 1


@pytest.mark.parametrize(
    ("timing", "expected"),
    [
        ({}, {}),
        ({"median_us": 12.5}, {None: TimingPoint(12.5)}),
        ({"median_us": 12.5, "shape": "s"}, {"s": TimingPoint(12.5)}),
        ({"shapes": {"a": {"median_us": 3.0, "human_us": 4.0,
                           "baselines": {"eager": 9.0, "cublas": {"median_us": 2.0}}},
                     "b": {"median_us": 0}}, "geomean_us": 3.0},
         {"a": TimingPoint(3.0, human_us=4.0, eager_us=9.0, cublas_us=2.0)}),
        ({"rows": [{"shape": "a", "candidate": {"median_us": 5.0}, "eager": {"median_us": 10.0},
                    "sol_us": 4.0}]},
         {"a": TimingPoint(5.0, sol_us=4.0, eager_us=10.0)}),
        ({"median_us": float("nan")}, {}),
        ({"median_us": "fast"}, {}),
        ({"geomean_us": 3.0}, {}),  # no shape, no per-shape data: not guessed
    ],
)
def test_timing_points_reads_the_known_forms_and_guesses_nothing(timing, expected):
    assert timing_points(timing) == expected
