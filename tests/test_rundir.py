"""Run directories: written atomically, read back whole (strictly) or as far as they go (tolerantly), found by
any reference a user types, refused clearly when broken, and summed up from their attempts."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from coda_agent import provenance
from coda_agent.messages import ChatMessage
from coda_agent.provenance import git_state, package_versions
from coda_agent.store.records import Attempt, RunHeader, RunSummary, Usage
from coda_agent.store.rundir import (
    RunReader,
    RunRecordError,
    RunWriter,
    attempt_file,
    new_run_id,
    read_run,
    resolve_run,
    rolled_up,
)

from .records_factory import make_run, verdict

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc)


def header(run_id: str = "20261129-120000_demo_abc123") -> RunHeader:
    return RunHeader(run_id=run_id, created=NOW, task="demo", task_version=1, task_path="tasks/demo.yaml",
                     model="mock/x")


def attempt(index: int, round_no: int = 1, slot: int = 0) -> Attempt:
    return Attempt(
        index=index, round=round_no, slot=slot, started=NOW, finished=NOW,
        messages=[ChatMessage(role="user", content="write it")],
        raw_response="```python\ndef forward(): ...\n```", code="def forward(): ...\n",
        usage=Usage(input_tokens=10, output_tokens=5, cost_usd=0.01),
    )


def test_writer_and_reader_round_trip(tmp_path):
    writer = RunWriter.create(tmp_path, header())
    for i in (2, 1, 10):
        writer.write_attempt(attempt(i, round_no=i))
    writer.write_summary(RunSummary(status="completed", attempts=3))
    writer.write_best("def forward(): ...\n")
    run_dir = tmp_path / header().run_id
    assert attempt_file(run_dir, 10).name == "0010.json"
    reader = RunReader(run_dir)
    assert reader.header == header()
    assert [a.index for a in reader.attempts()] == [1, 2, 10]
    assert reader.attempts()[0].usage.cost_usd == 0.01
    assert reader.summary().status == "completed"
    assert reader.best_code() == "def forward(): ...\n"
    assert not [p for p in run_dir.rglob(".*") if p.is_file()], "temporary files left behind"


def test_reader_ignores_half_written_temporaries_and_tolerates_a_missing_summary(tmp_path):
    writer = RunWriter.create(tmp_path, header())
    writer.write_attempt(attempt(1))
    run_dir = writer.run_dir
    (run_dir / "attempts" / ".0002.json.123.tmp").write_text('{"index": 2, "rou')  # a write cut by kill -9
    reader = RunReader(run_dir)
    assert [a.index for a in reader.attempts()] == [1]
    assert reader.summary() is None and reader.best_code() is None


def test_broken_records_are_one_clear_error(tmp_path):
    with pytest.raises(RunRecordError, match=r"header\.json: missing"):
        RunReader(tmp_path)
    writer = RunWriter.create(tmp_path, header())
    (writer.run_dir / "attempts" / "0001.json").write_text("{not json")
    with pytest.raises(RunRecordError, match=r"0001\.json: unreadable run record"):
        RunReader(writer.run_dir).attempts()
    newer = header("20261129-120000_demo_fff000").model_copy(update={"schema_version": 99})
    future = RunWriter.create(tmp_path, newer)
    with pytest.raises(RunRecordError, match="newer than this coda-agent"):
        RunReader(future.run_dir)
    with pytest.raises(RunRecordError, match="already exists"):
        RunWriter.create(tmp_path, header())


def test_resolve_run_by_path_name_id_prefix_suffix_and_latest(tmp_path):
    RunWriter.create(tmp_path, header("20261129-120000_demo_abc123"))
    later = header("20261129-130000_demo_def456").model_copy(update={"created": NOW + timedelta(hours=1)})
    RunWriter.create(tmp_path, later)
    renamed = header("20261129-110000_demo_777aaa").model_copy(update={"created": NOW - timedelta(hours=1)})
    # its run id is no longer its name
    RunWriter.create(tmp_path, renamed).run_dir.rename(tmp_path / "kept-by-hand")
    # killed before its header was written
    (tmp_path / "20261129-140000_demo_cut" / "attempts").mkdir(parents=True)
    first = tmp_path / "20261129-120000_demo_abc123"
    assert resolve_run(first, tmp_path / "elsewhere") == first  # a path
    assert resolve_run("20261129-130000_demo_def456", tmp_path).name == "20261129-130000_demo_def456"
    assert resolve_run("abc123", tmp_path) == first  # a unique suffix
    assert resolve_run("20261129-13", tmp_path).name == "20261129-130000_demo_def456"  # a unique prefix
    assert resolve_run("20261129-110000_demo_777aaa", tmp_path).name == "kept-by-hand"  # by run id
    assert resolve_run("777aaa", tmp_path).name == "kept-by-hand"
    # shown even without a header
    assert resolve_run("20261129-14", tmp_path).name == "20261129-140000_demo_cut"
    # created last, by its header
    assert resolve_run("latest", tmp_path).name == "20261129-130000_demo_def456"
    with pytest.raises(RunRecordError, match="matches 4 runs"):
        resolve_run("20261129", tmp_path)
    for ref in ("nope", "%", "*", "ab?123"):  # no wildcards: a reference is matched literally
        with pytest.raises(RunRecordError, match=re.escape(f"no run '{ref}'")):
            resolve_run(ref, tmp_path)
    with pytest.raises(RunRecordError, match="not a run directory"):
        resolve_run(tmp_path / "elsewhere" / "abc123", tmp_path)
    with pytest.raises(RunRecordError, match="no run in"):
        resolve_run("latest", tmp_path / "elsewhere")


def test_the_tolerant_reader_keeps_what_it_can(tmp_path):
    run = make_run(tmp_path, outcomes=("compile_error", "wrong_output", "passed"), times={"s": 104.0})
    (run / "attempts" / "0001.json").write_text('{"index": "one"}')
    (run / "attempts" / "0003.json.corrupt").write_text("set aside: not an attempt")
    (run / "summary.json").write_text("{")
    files = read_run(run)
    assert files.header is not None and [a.index for a in files.attempts] == [2, 3]
    problems = {str(Path(p.file).relative_to(run)): p.message for p in files.problems}
    assert set(problems) == {"summary.json", "attempts/0001.json"}  # the set-aside file is no attempt
    assert problems["summary.json"].startswith("invalid JSON (Expecting property name")
    assert problems["attempts/0001.json"].startswith("does not match the schema: index")
    (run / "summary.json").write_text('{"status": "a\tb"}')  # json says "Invalid control character at"
    assert [p.message for p in read_run(run).problems if p.file.endswith("summary.json")] == [
        "invalid JSON (Invalid control character at line 1, column 14)"]
    assert files.best_code is not None and "def forward" in files.best_code
    # no readable summary.json: rolled up from the attempts (and no writer)
    summary = files.effective_summary()
    assert ((summary.status, summary.attempts, summary.passes, summary.best_attempt)
            == ("interrupted", 2, 1, 3))
    assert (summary.best_time_us == pytest.approx(104.0)
            and summary.seconds_to_first_correct == pytest.approx(80.0))
    assert json.loads(json.dumps(files.as_json()))["summary_from_file"] is False
    empty = tmp_path / "empty"
    empty.mkdir()
    assert read_run(empty).problems[0].message == "missing (empty or incomplete run directory)"


def test_the_roll_up_is_the_figures_the_attempts_imply():
    timed = attempt(2, round_no=2).model_copy(update={
        "timing": {"shapes": {"a": {"median_us": 20.0}, "b": {"median_us": 80.0}}, "speedup_vs_human": 1.1},
    })
    passed = timed.model_copy(update={"verdict": verdict("passed", "demo", 1)})
    unpriced = attempt(1).model_copy(
        update={"usage": Usage(input_tokens=7, output_tokens=3, price_known=False)})
    summary = rolled_up(RunSummary(status="completed", wall_seconds=9.0), [unpriced, passed])
    assert (summary.status, summary.wall_seconds) == ("completed", 9.0)  # the caller's figures are kept
    assert (summary.rounds, summary.attempts, summary.passes, summary.best_attempt) == (2, 2, 1, 2)
    assert summary.best_time_us == pytest.approx(40.0) and summary.speedup_vs_human == 1.1
    assert summary.outcomes == {"unverified": 1, "passed": 1}
    assert ((summary.input_tokens, summary.output_tokens, summary.cost_usd, summary.cost_known)
            == (17, 8, 0.01, False))
    assert rolled_up(RunSummary(), []).best_attempt is None


def test_run_ids_sort_by_time_and_name_the_task():
    a, b = new_run_id("gemm_x", NOW), new_run_id("gemm_x", NOW.replace(hour=13))
    assert a.startswith("20261129-120000_gemm_x_") and len(a.rsplit("_", 1)[1]) == 6
    assert a < b and a != new_run_id("gemm_x", NOW)


def test_environment_facts_for_the_header():
    versions = package_versions()
    assert {"coda-agent", "torch"} <= set(versions)
    commit, dirty = git_state()
    assert commit is None or (len(commit) == 40 and isinstance(dirty, bool))


def test_a_tree_git_cannot_compare_with_its_head_is_not_recorded_as_that_commit_clean(monkeypatch):
    """The GPU machine's copy of the tree sat beside a .git of another commit (2026-12-06): where
    ``git status`` fails, the commit is kept but marked dirty; the environment's named commit wins over
    both."""

    def fake_run(args, **_):
        ok = args[1] == "rev-parse"
        return subprocess.CompletedProcess(args, 0 if ok else 128, stdout="a" * 40 + "\n" if ok else "")

    monkeypatch.delenv(provenance.COMMIT_ENV, raising=False)
    monkeypatch.setattr(provenance.subprocess, "run", fake_run)
    assert provenance.git_state() == ("a" * 40, True)
    assert provenance.git_commit() == "a" * 40 + "-dirty"
    monkeypatch.setenv(provenance.COMMIT_ENV, "b" * 40)
    assert provenance.git_commit() == "b" * 40
