"""Run directories: written atomically, read back whole, found by id, refused clearly when broken."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from coda_agent.messages import ChatMessage
from coda_agent.provenance import git_state, package_versions
from coda_agent.store.records import Attempt, RunHeader, RunSummary, Usage
from coda_agent.store.runs import RunReader, RunRecordError, RunWriter, attempt_file, new_run_id, resolve_run

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc)


def header(run_id: str = "20261129-120000_demo_abc123") -> RunHeader:
    return RunHeader(run_id=run_id, created=NOW, task="demo", task_version=1, task_path="tasks/demo.yaml", model="mock/x")


def attempt(index: int, round_no: int = 1, slot: int = 0) -> Attempt:
    return Attempt(
        index=index, round=round_no, slot=slot, started=NOW, finished=NOW,
        messages=[ChatMessage(role="user", content="write it")], raw_response="```python\ndef forward(): ...\n```",
        code="def forward(): ...\n", usage=Usage(input_tokens=10, output_tokens=5, cost_usd=0.01),
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


def test_resolve_run_by_path_id_prefix_and_suffix(tmp_path):
    RunWriter.create(tmp_path, header("20261129-120000_demo_abc123"))
    RunWriter.create(tmp_path, header("20261129-130000_demo_def456"))
    assert resolve_run(tmp_path / "20261129-120000_demo_abc123") == tmp_path / "20261129-120000_demo_abc123"
    assert resolve_run("20261129-130000_demo_def456", tmp_path).name == "20261129-130000_demo_def456"
    assert resolve_run("abc123", tmp_path).name == "20261129-120000_demo_abc123"
    assert resolve_run("20261129-13", tmp_path).name == "20261129-130000_demo_def456"
    with pytest.raises(RunRecordError, match="matches 2 runs"):
        resolve_run("20261129", tmp_path)
    with pytest.raises(RunRecordError, match="no run 'nope'"):
        resolve_run("nope", tmp_path)


def test_run_ids_sort_by_time_and_name_the_task():
    a, b = new_run_id("gemm_x", NOW), new_run_id("gemm_x", NOW.replace(hour=13))
    assert a.startswith("20261129-120000_gemm_x_") and len(a.rsplit("_", 1)[1]) == 6
    assert a < b and a != new_run_id("gemm_x", NOW)


def test_environment_facts_for_the_header():
    versions = package_versions()
    assert {"coda-agent", "torch"} <= set(versions)
    commit, dirty = git_state()
    assert commit is None or (len(commit) == 40 and isinstance(dirty, bool))
