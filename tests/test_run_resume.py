"""``coda-agent run --resume`` of a run that has ended: its result again and its own exit status, no model asked
(the runs here are a real model's, with no key and no sandbox: asking would fail)."""

from __future__ import annotations

from .conftest import cli
from .records_factory import make_run


def test_a_run_that_reached_its_target_is_not_resumed(tmp_path, capsys):
    run = make_run(tmp_path, outcomes=("wrong_output", "passed"))
    code, out, err = cli(capsys, "run", "--resume", run.name, "--runs-dir", str(tmp_path))
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0] == f"run {run.name.rsplit('_', 1)[1]} already finished (target reached, 1 correct): nothing to resume"
    assert lines[1].startswith("PASSED gemm_rmsnorm v1: attempt #2 is correct") and "resuming" not in out
    assert "to go on" not in out  # a larger budget changes nothing: the target is met


def test_a_run_that_spent_its_budget_exits_as_it_did_and_says_how_to_go_on(tmp_path, capsys):
    run = make_run(tmp_path, outcomes=("wrong_output", "wrong_output"))
    code, out, err = cli(capsys, "run", "--resume", run.name, "--runs-dir", str(tmp_path))
    assert code == 1, out + err
    assert "already finished (budget exhausted, no correct kernel)" in out and "FAILED gemm_rmsnorm v1" in out
    assert f"  to go on: coda-agent run --resume {run} --rounds N (or a larger budget)" in out.splitlines()
    code, out, err = cli(capsys, "run", "--resume", run.name, "--rounds", "5", "--runs-dir", str(tmp_path))
    assert code == 2 and "already finished" not in out, out + err  # a budget raised: it goes on (here: no API key)


def test_a_run_recorded_before_example_places_resumes_with_its_task_folder_as_one(tmp_path):
    """Runs then searched their task's own folder for examples; a resume must rebuild the prompts they started with."""
    from datetime import datetime, timezone

    from coda_agent.agent.loop import AgentConfig
    from coda_agent.store.records import RunHeader

    (tmp_path / "t.yaml").write_text("")
    header = RunHeader(run_id="r", created=datetime.now(timezone.utc), task="t", task_version=1,
                       task_path=str(tmp_path / "t.yaml"), model="mock/x", params={"examples": ["gemm_rope"]})
    assert AgentConfig.from_header(header).example_places == (str(tmp_path),)
    recorded = header.model_copy(update={"params": {"example_places": []}})
    assert AgentConfig.from_header(recorded).example_places == ()
    gone = header.model_copy(update={"task_path": str(tmp_path / "gone" / "t.yaml")})
    assert AgentConfig.from_header(gone).example_places == ()
