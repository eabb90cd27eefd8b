"""``coda-agent run --resume`` of a run that has ended: its result again and its own exit status, no model
asked (the runs here are a real model's, with no key and no sandbox: asking would fail)."""

from __future__ import annotations

from pathlib import Path

from .conftest import cli
from .records_factory import make_run


def test_a_run_that_reached_its_target_is_not_resumed(tmp_path, capsys):
    run = make_run(tmp_path, outcomes=("wrong_output", "passed"))
    code, out, err = cli(capsys, "run", "--resume", run.name, "--runs-dir", str(tmp_path))
    assert code == 0, out + err
    lines = out.splitlines()
    assert (lines[0]
            == f"run {run.name.rsplit('_', 1)[1]} already finished (target reached, 1 correct): nothing to "
               "resume")
    assert lines[1].startswith("PASSED gemm_rmsnorm v1: attempt #2 is correct") and "resuming" not in out
    assert "to go on" not in out  # a larger budget changes nothing: the target is met


def test_a_run_that_spent_its_budget_exits_as_it_did_and_says_how_to_go_on(tmp_path, capsys):
    run = make_run(tmp_path, outcomes=("wrong_output", "wrong_output"))
    code, out, err = cli(capsys, "run", "--resume", run.name, "--runs-dir", str(tmp_path))
    assert code == 1, out + err
    assert "already finished (budget exhausted, no correct kernel)" in out and "FAILED gemm_rmsnorm v1" in out
    assert f"  to go on: coda-agent run --resume {run} --rounds N (or a larger budget)" in out.splitlines()
    code, out, err = cli(capsys, "run", "--resume", run.name, "--rounds", "5", "--runs-dir", str(tmp_path))
    # a budget raised: it goes on (here: no API key)
    assert code == 2 and "already finished" not in out, out + err


def test_a_run_recorded_before_example_places_resumes_with_its_task_folder_as_one(tmp_path):
    """Runs then searched their task's own folder for examples; a resume must rebuild the prompts they started
    with."""
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


# --- one writer per run -------------------------------------------------------------------------------------

REFUSED = "```python\nimport os\n\n\ndef forward(x, w, residual, gamma, eps):\n    return {}\n```"

#: A resume that stays live: its next reply never comes, so it holds the run until it is killed.
LIVE_RESUME = """
import asyncio, sys
from pathlib import Path
from coda_agent.agent import Agent
from coda_agent.providers import MockProvider
from coda_agent.store.records import Budgets

async def never(messages):
    await asyncio.sleep(3600)

agent = Agent.resume(Path(sys.argv[1]), MockProvider(never), budgets=Budgets(rounds=3))
asyncio.run(agent.run())
"""


def _one_round_run(runs):
    import asyncio

    from coda_agent.agent import Agent, AgentConfig
    from coda_agent.providers import MockProvider
    from coda_agent.store.records import Budgets
    from coda_agent.tasks import find_task
    from coda_agent.verifier import Plan

    agent = Agent.create(find_task("gemm_residual_rmsnorm"), MockProvider([REFUSED]),
                         AgentConfig(model="mock/test", plan=Plan(), budgets=Budgets(rounds=1)), runs)
    asyncio.run(agent.run())
    return agent.run_dir


def test_a_second_resume_of_a_live_run_is_refused_and_a_killed_one_reads_as_interrupted(tmp_path, capsys):
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from coda_agent.agent import Agent
    from coda_agent.providers import MockProvider
    from coda_agent.store.index import Index
    from coda_agent.store.records import Budgets
    from coda_agent.store.rundir import RunReader, writer_alive
    from coda_agent.viewer import Site

    runs = tmp_path / "runs"
    run_dir = _one_round_run(runs)
    script = tmp_path / "live.py"
    script.write_text(LIVE_RESUME)
    import coda_agent

    # this checkout's package, not whichever one is installed
    here = str(Path(coda_agent.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    first = subprocess.Popen([sys.executable, str(script), str(run_dir)], env=env)
    try:
        deadline = time.monotonic() + 120
        while not (writer_alive(run_dir) and RunReader(run_dir).summary().status == "running"):
            assert time.monotonic() < deadline and first.poll() is None, "the first resume did not start"
            time.sleep(0.05)
        before = {p.name: p.read_bytes() for p in (run_dir / "attempts").iterdir()}
        header = (run_dir / "header.json").read_bytes()

        code, out, err = cli(capsys, "run", "--resume", str(run_dir), "--rounds", "3", "--runs-dir",
                             str(runs))
        assert code == 2, out + err
        assert err.strip().splitlines() == [
            f"error: run {run_dir.name} is being written by pid {first.pid} on host {_host()} "
            f"(heartbeat {err.split('(heartbeat ')[1].split(')')[0]}); wait for it to end or stop it first"
        ]
        assert {p.name: p.read_bytes() for p in (run_dir / "attempts").iterdir()} == before
        assert (run_dir / "header.json").read_bytes() == header
        code, out, _ = cli(capsys, "show", str(run_dir), "--runs-dir", str(runs))
        assert "status running" in out and "resume with" not in out
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()

    # kill -9: the summary still says running; every reader says interrupted, and how to resume
    assert RunReader(run_dir).summary().status == "running" and (run_dir / "writer.lock").exists()
    resume = f"coda-agent run --resume {run_dir}"
    code, out, _ = cli(capsys, "show", str(run_dir), "--runs-dir", str(runs))
    assert code == 0 and "status interrupted, no correct kernel" in out and f"pid {first.pid}" in out
    assert resume in " ".join(out.split())  # the table may wrap it
    code, out, _ = cli(capsys, "show", str(run_dir), "--runs-dir", str(runs), "--format", "json")
    data = json.loads(out)
    assert (data["summary"]["status"] == "interrupted" and data["resume_command"] == resume
            and data["writer"] is None)
    with Index.open(runs) as ix:
        ix.refresh()
        (row,) = ix.runs()
        assert row.status == "interrupted" and resume in row.stop_reason
    site = Site(runs, None)
    assert site.leaderboard_data()["runs"][0]["status"] == "interrupted"
    page = site.get(f"/run/{run_dir.name}.json")
    assert json.loads(page.body)["summary"]["status"] == "interrupted"

    # the dead writer's lock is taken over; the resume redoes nothing that was finished
    summary = asyncio_run(Agent.resume(run_dir, MockProvider([REFUSED, REFUSED]), budgets=Budgets(rounds=3)))
    assert summary.status == "completed" and summary.attempts == 3
    assert (run_dir / "attempts" / "0001.json").read_bytes() == before["0001.json"]
    assert not (run_dir / "writer.lock").exists()


def _host() -> str:
    from coda_agent.provenance import host_name

    return host_name()


def asyncio_run(agent):
    import asyncio

    return asyncio.run(agent.run())
