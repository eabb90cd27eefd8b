"""Sweeps: several tasks (or a folder) and several models in one ``coda-agent run``, resumable, one table at
the end."""

from __future__ import annotations

import json
import shutil

from coda_agent.store.records import SweepRecord
from coda_agent.store.rundir import RunReader
from coda_agent.tasks import find_task

from .conftest import TASK_DIR, cli
from .fake_llm_server import OPENAI_PATH, FakeLLMServer, openai_chat

MODELS = ("--model", "mock/gemm_residual_three_attempts", "--model", "mock/echo")


def sweep_record(runs) -> SweepRecord:
    (path,) = runs.glob("*.sweep.json")
    return SweepRecord.model_validate_json(path.read_text())


def test_every_task_with_every_model_then_a_table(tmp_path, capsys):
    runs = tmp_path / "runs"
    code, out, err = cli(capsys, "run", "gemm_residual_rmsnorm", "gemm_rmsnorm", *MODELS, "--rounds", "3",
                         "--no-compile", "--runs-dir", str(runs))
    assert code == 1, out + err  # not every run found a correct kernel
    assert "2 task(s) × 2 model(s) = 4 runs, 2 at a time" in out
    record = sweep_record(runs)
    pairs = [(m.task.rsplit("/", 1)[-1], m.model) for m in record.members]
    assert pairs == [(t, m) for t in ("gemm_residual_rmsnorm.yaml", "gemm_rmsnorm.yaml")
                     for m in ("mock/gemm_residual_three_attempts", "mock/echo")]
    headers = [RunReader(runs / m.run).header for m in record.members]
    assert [(h.task, h.model) for h in headers] == [(t.split(".")[0], m) for t, m in pairs]
    assert RunReader(runs / record.members[0].run).summary().status == "target_reached"
    assert "[gemm_residual_rmsnorm · mock/echo] #1" in out  # attempt lines say which run they belong to
    table = out[out.index(f"sweep {record.sweep_id}"):]
    # as `show` says
    assert table.count("target reached, 1 correct") == 1 and table.count("no correct kernel") == 3
    lines = out.splitlines()
    # each path whole
    assert all(any(line.endswith(str(runs / m.run)) for line in lines) for m in record.members)
    assert lines[-1] == "FAILED 1 of 4 runs found a correct kernel; 3 found none"


def test_the_closing_line_counts_what_became_of_each_run_and_the_exit_status_is_the_worst():
    """Each run's status as ``run`` gives it alone (0 a correct kernel, 1 none or the harness failed, 2 a
    set-up or provider error); the sweep's is the worst of them."""
    from coda_agent.cli.sweep import _Outcome, closing_line
    from coda_agent.store.records import RunSummary, SweepMember

    member = SweepMember(task="gemm_swiglu.yaml", model="mock/echo")
    correct = _Outcome(member, RunSummary(status="target_reached", attempts=2, passes=1, best_attempt=2))
    none = _Outcome(member, RunSummary(status="completed", attempts=3))
    harness = _Outcome(member, RunSummary(status="failed", attempts=1), error="the run failed: ValueError",
                       failed=1)
    setup = _Outcome(member, error="no ANTHROPIC_API_KEY", failed=2)
    unstarted = _Outcome(member, error="not started: the sweep's $1 are spent")
    assert [o.exit_status for o in (correct, none, harness, setup, unstarted)] == [0, 1, 1, 2, 1]
    assert closing_line([correct, correct]) == "[bold green]PASSED[/] all 2 runs found a correct kernel"
    assert closing_line([correct, none, none, harness, setup, unstarted]) == (
        "[bold red]FAILED[/] 1 of 6 runs found a correct kernel; 2 found none, 2 failed, 1 not started")


def test_a_folder_of_tasks_is_a_sweep(tmp_path, capsys):
    folder = tmp_path / "mine"
    (folder / "human").mkdir(parents=True)
    for name in ("gemm_residual", "gemm_swiglu"):
        for rel in (f"{name}.yaml", f"{name}.py", f"human/{name}.py"):
            shutil.copy(TASK_DIR / rel, folder / rel)
    code, out, _ = cli(capsys, "run", str(folder), "--model", "mock/echo", "--rounds", "1", "--no-compile",
                       "--runs-dir", str(tmp_path / "runs"))
    assert code == 1 and "2 task(s) × 1 model(s) = 2 runs" in out
    assert sorted(m.task for m in sweep_record(tmp_path / "runs").members) == sorted(
        str((folder / f"{n}.yaml").resolve()) for n in ("gemm_residual", "gemm_swiglu"))


def test_resume_starts_the_missing_runs_and_continues_the_interrupted_ones(tmp_path, capsys):
    runs = tmp_path / "runs"
    cli(capsys, "run", "gemm_residual_rmsnorm", "gemm_rmsnorm", *MODELS, "--rounds", "3", "--no-compile",
        "--runs-dir", str(runs))
    (path,) = runs.glob("*.sweep.json")
    record = sweep_record(runs)
    interrupted, finished, never = (runs / record.members[0].run, runs / record.members[1].run,
                                    record.members[3].run)
    (interrupted / "attempts" / "0003.json").unlink()
    summary = json.loads((interrupted / "summary.json").read_text())
    (interrupted / "summary.json").write_text(
        json.dumps({**summary, "status": "interrupted", "best_attempt": None}))
    shutil.rmtree(runs / never)
    data = json.loads(path.read_text())
    data["members"][3]["run"] = None
    path.write_text(json.dumps(data))
    untouched = (finished / "summary.json").read_bytes()

    code, out, err = cli(capsys, "run", "--resume", record.sweep_id[:14], "--runs-dir", str(runs))
    assert code == 1, out + err
    assert "resuming sweep" in out and "3 of 4 runs started before" in out
    assert ([a.outcome for a in RunReader(interrupted).attempts()]
            == ["static_rejected", "wrong_output", "passed"])
    assert RunReader(interrupted).summary().status == "target_reached"
    assert (finished / "summary.json").read_bytes() == untouched
    again = sweep_record(runs)
    assert again.members[3].run is not None and again.members[3].run != never
    assert len([d for d in runs.iterdir() if d.is_dir()]) == 4


def test_a_sweep_resumed_by_its_file_finds_its_runs_beside_it(tmp_path, capsys):
    runs = tmp_path / "runs"
    cli(capsys, "run", "gemm_residual_rmsnorm", "gemm_rmsnorm", *MODELS, "--rounds", "3", "--no-compile",
        "--runs-dir", str(runs))
    (path,) = runs.glob("*.sweep.json")
    record = sweep_record(runs)
    shutil.rmtree(runs / record.members[3].run)
    data = json.loads(path.read_text())
    data["members"][3]["run"] = None
    path.write_text(json.dumps(data))

    code, out, err = cli(capsys, "run", "--resume", str(path), "--runs-dir", str(tmp_path / "elsewhere"))
    assert code == 1 and "3 of 4 runs started before" in out, out + err
    assert "a run directory?" not in out + err and "failed" not in out, out + err
    assert all((runs / m.run / "summary.json").is_file() for m in sweep_record(runs).members)
    assert not (tmp_path / "elsewhere").exists()


def test_a_run_given_by_its_path_is_no_sweep(tmp_path):
    """``run --resume /abs/runs/<id>``, the command an interrupted run prints, is a run even where a runs
    folder exists (a path was once globbed as a sweep id's prefix, which pathlib refuses for absolute
    patterns)."""
    from coda_agent.cli.sweep import sweep_file

    base = tmp_path / "runs"
    (base / "20261203-085454_gemm_residual_abc123").mkdir(parents=True)
    assert sweep_file(str(base / "20261203-085454_gemm_residual_abc123"), base) is None
    assert sweep_file("runs/20261203", base) is None


def test_bad_input_stops_a_sweep_before_any_run(tmp_path, capsys):
    runs = tmp_path / "runs"
    code, _, err = cli(capsys, "run", "gemm_residual", "gemm_rmsnorm", "--model", "mock/echo", "--model",
                       "nosuch/x", "--runs-dir", str(runs))
    assert code == 2 and "unknown provider 'nosuch/x'" in err and err.count("\n") == 1
    code, _, err = cli(capsys, "run", "gemm_residual", "nosuch_task", "--model", "mock/echo", "--runs-dir",
                       str(runs))
    assert code == 2 and "no task named 'nosuch_task'" in err
    code, _, err = cli(capsys, "run", "gemm_residual", "--model", "mock/echo", "--model", "replay/x",
                       "--runs-dir", str(runs))
    assert code == 2 and "cannot be part of a sweep" in err
    assert not runs.exists()


def test_every_model_that_cannot_start_is_named_at_once(tmp_path, capsys, monkeypatch):
    from types import SimpleNamespace

    from coda_agent.cli import run_cmd

    monkeypatch.setattr(run_cmd, "require_isolation",
                        lambda what: SimpleNamespace(isolated=True, describe=lambda: ""))
    for key in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL",
                "CODA_AGENT_NO_REAL_API"):
        monkeypatch.delenv(key, raising=False)
    runs = tmp_path / "runs"
    code, _, err = cli(capsys, "run", "gemm_residual", "--model", "anthropic/claude-x", "--model",
                       "mock/echo", "--model", "openai/gpt-x", "--runs-dir", str(runs))
    assert code == 2, err
    lines = err.splitlines()
    assert lines[0] == "error: 2 problems before the sweep can start:", err
    assert len(lines) == 3 and "ANTHROPIC_API_KEY" in lines[1] and "OPENAI_API_KEY" in lines[2], err
    assert not runs.exists()


def test_a_sweep_takes_no_more_cpu_workers_than_runs_or_cores():
    from coda_agent.cli.sweep import cpu_workers

    assert cpu_workers(jobs=2, runs=2, cpus=2) == 2  # a sweep of 2 runs on a 2-core machine: 2, not 4
    assert cpu_workers(jobs=2, runs=4, cpus=16) == 4  # two runs in flight, two verifications each
    assert cpu_workers(jobs=4, runs=1, cpus=16) == 2  # one run needs no more than it would alone
    assert cpu_workers(jobs=8, runs=8, cpus=1) == 1


def test_resume_with_higher_budgets_extends_every_run(tmp_path, capsys):
    runs = tmp_path / "runs"
    cli(capsys, "run", "gemm_residual_rmsnorm", *MODELS, "--rounds", "1", "--no-compile", "--runs-dir",
        str(runs))
    record = sweep_record(runs)
    # nothing left to do
    code, out, err = cli(capsys, "run", "--resume", record.sweep_id, "--runs-dir", str(runs))
    assert (code == 1 and "already finished: nothing to resume" in out
            and "started before" not in out), out + err
    assert "FAILED 0 of 2 runs found a correct kernel" in out
    assert [RunReader(runs / m.run).summary().attempts for m in record.members] == [1, 1]
    code, _, err = cli(capsys, "run", "--resume", record.sweep_id, "--temperature", "0.1", "--runs-dir",
                       str(runs))
    assert code == 2 and "only budgets" in err and "temperature" in err
    code, out, err = cli(capsys, "run", "--resume", record.sweep_id, "--rounds", "2", "--runs-dir", str(runs))
    assert code == 1, out + err
    assert [RunReader(runs / m.run).summary().rounds for m in record.members] == [2, 2]
    assert sweep_record(runs).options["rounds"] == 2


def test_total_dollars_stops_the_whole_sweep(tmp_path, capsys, monkeypatch):
    prices = tmp_path / "prices.yaml"
    prices.write_text("openai-compatible/qwen: {input: 100000, output: 0}\n")  # 10 prompt tokens: $1 a call
    monkeypatch.setenv("CODA_AGENT_PRICES", str(prices))
    server = FakeLLMServer().start()
    try:
        for _ in range(6):
            server.reply(OPENAI_PATH, openai_chat("no code in this reply", model="qwen"))
        code, out, err = cli(capsys, "run", "gemm_residual", "gemm_rmsnorm", "--model",
                             "openai-compatible/qwen", "--base-url", f"{server.url}/v1", "--rounds", "3",
                             "--jobs", "1", "--total-dollars", "1.5", "--no-compile", "--runs-dir",
                             str(tmp_path / "runs"))
    finally:
        server.stop()
    assert code == 1, out + err
    first, second = sweep_record(tmp_path / "runs").members
    summary = RunReader(tmp_path / "runs" / first.run).summary()
    assert (summary.status == "budget_exhausted" and summary.attempts == 2
            and "sweep's dollar budget" in summary.stop_reason)
    assert second.run is None and "not started" in out
    code, _, err = cli(capsys, "run", "gemm_residual", "--model", "mock/echo", "--total-dollars", "1",
                       "--runs-dir", str(tmp_path))
    assert code == 2 and "--total-dollars is for sweeps" in err


def test_a_sweep_calls_a_task_by_its_name_not_its_file_name(tmp_path):
    """tasks, run and the leaderboard call a task by its ``name:``; the sweep's lines and table did by its
    file."""
    from coda_agent.cli.sweep import task_name

    suite = TASK_DIR / "gemm_residual.yaml"
    renamed = tmp_path / "my_copy.yaml"
    shutil.copy(suite, renamed)
    shutil.copy(TASK_DIR / find_task("gemm_residual").reference_file.name, tmp_path)
    # the copy names its human kernel: a task whose human: file is missing does not load
    (tmp_path / "human").mkdir()
    shutil.copy(TASK_DIR / "human" / "gemm_residual.py", tmp_path / "human")
    assert task_name(str(renamed)) == "gemm_residual"
    assert task_name(str(tmp_path / "gone.yaml")) == "gone"  # a file that no longer loads: its stem


def test_a_second_resume_of_a_live_sweep_is_refused_before_it_touches_anything(tmp_path, capsys):
    """A sweep runs in one process at a time: while one holds its lock (here this test does), ``--resume``
    says who in one line, starts no run and leaves the record as it was."""
    import os
    from datetime import datetime, timezone

    from coda_agent.cli.sweep import hold_sweep
    from coda_agent.provenance import host_name
    from coda_agent.store.records import SweepMember, write_json_atomic

    runs = tmp_path / "runs"
    record = SweepRecord(sweep_id="sweep_20260101-000000_abc123", created=datetime.now(timezone.utc),
                         options={},
                         members=[SweepMember(task=str(TASK_DIR / "gemm_residual.yaml"), model="mock/echo")])
    path = runs / f"{record.sweep_id}.sweep.json"
    write_json_atomic(path, record)
    kept = path.read_bytes()
    with hold_sweep(path):
        code, out, err = cli(capsys, "run", "--resume", str(path), "--rounds", "2", "--runs-dir", str(runs))
    assert code == 2, out + err
    (line,) = err.strip().splitlines()
    assert line.startswith(
        f"error: sweep {record.sweep_id} is being written by pid {os.getpid()} on host {host_name()}")
    assert path.read_bytes() == kept and not [d for d in runs.iterdir() if d.is_dir()]
    assert not (runs / f"{record.sweep_id}.sweep.lock").exists(), "the lock goes with its holder"
