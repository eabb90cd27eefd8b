"""The model-written example records in ``examples/runs/`` load strictly and show, as examples/README.md
says."""

from __future__ import annotations

import json
import shutil

import pytest

from coda_agent.store.rundir import RunReader, iter_run_dirs

from .conftest import REPO, cli

EXAMPLES = REPO / "examples" / "runs"


@pytest.fixture
def examples(tmp_path):
    """A copy, so the index the leaderboard writes lands outside the checkout."""
    copy = tmp_path / "runs"
    shutil.copytree(EXAMPLES, copy, ignore=shutil.ignore_patterns("index.db*"))
    return copy


def test_every_example_is_a_complete_clean_model_written_run():
    runs = list(iter_run_dirs(EXAMPLES))
    assert len(runs) == 2
    readme = (REPO / "examples" / "README.md").read_text()
    for run in runs:
        reader = RunReader(run)
        header, summary, attempts = reader.header, reader.summary(), reader.attempts()
        assert header.model == "manual" and header.device == "cpu" and header.git_dirty is False
        assert summary is not None and summary.passes >= 1 and len(attempts) == summary.attempts
        assert all(a.verdict is not None and a.verdict.sandbox == "bwrap" for a in attempts)
        assert (run / "best.py").read_text() == attempts[summary.best_attempt - 1].code
        for n in range(1, len(attempts) + 1):  # the prompt and the reply, as the model saw and wrote them
            assert ((run / "manual" / f"prompt-{n}.md").is_file()
                    and (run / "manual" / f"answer-{n}.md").is_file())
        assert not (run / "writer.lock").exists()
        assert f"`{run.name}`" in readme  # the README's table names every run it ships


def test_the_documented_commands_show_them(capsys, examples):
    code, out, err = cli(capsys, "leaderboard", "--runs-dir", str(examples), "--format", "json")
    assert code == 0, err
    rows = [r for r in json.loads(out)["summary"] if r["author"] == "manual"]
    assert {r["task"] for r in rows} == {"gemm_rmsnorm_rope", "gemm_rmsnorm_cross_entropy"}
    assert all(r["correct"] and r["device"] == "cpu" and r["runs"] == 1 for r in rows)
    for suffix, task in (("f6311c", "gemm_rmsnorm_rope"), ("69e102", "gemm_rmsnorm_cross_entropy")):
        code, out, err = cli(capsys, "show", suffix, "--runs-dir", str(examples))
        assert code == 0, err
        assert f"task {task} v2" in out and "model manual" in out and "passed" in out
    code, out, err = cli(capsys, "show", "69e102", "--runs-dir", str(examples), "--attempt", "1")
    assert code == 0 and "OnlineLSEReduce" in out, err
