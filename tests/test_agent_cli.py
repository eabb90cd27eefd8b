"""``coda-agent run`` end to end with the shipped mock script: record, feedback, resume, replay, Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from coda_agent.store.rundir import RunReader
from coda_agent.verifier.static.schedule_source import unpinned

from .conftest import EXAMPLE_SCRIPT, REPO, TASK_DIR, cli, invoke
from .fake_llm_server import OPENAI_PATH, FakeLLMServer, openai_chat
from .records_factory import make_run

SCRIPT = "gemm_residual_three_attempts"  # the shipped example, by name: works from any folder
TASK_YAML = str(TASK_DIR / "gemm_residual_rmsnorm.yaml")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, str]:
    """One run of the README's main job from an empty folder (compile off to stay fast): the record every test
    below reads."""
    runs = tmp_path_factory.mktemp("runs")
    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("elsewhere"))
    try:
        code = invoke("run", "gemm_residual_rmsnorm", "--model", f"mock/{SCRIPT}", "--no-compile",
                      "--runs-dir", str(runs))
    finally:
        os.chdir(cwd)
    assert code == 0
    (run_dir,) = runs.iterdir()
    return run_dir, SCRIPT


def test_run_converges_in_three_attempts_and_writes_a_complete_record(recorded):
    run_dir, _ = recorded
    reader = RunReader(run_dir)
    h = reader.header
    assert h.task == "gemm_residual_rmsnorm" and h.task_version == 1 and h.task_path == TASK_YAML
    assert h.model == f"mock/{SCRIPT}" and h.verifier_stages == ["correctness"] and h.device == "cpu"
    assert h.budgets.rounds == 5 and h.budgets.candidates_per_round == 1 and h.target == {"correct": True}
    assert {"coda-agent", "torch", "quack-kernels", "nvidia-cutlass-dsl"} <= set(h.packages)
    assert h.params["temperature"] == 0.7 and len(h.params["examples"]) == 2
    assert h.git_commit is None or len(h.git_commit) == 40
    assert (run_dir.name.startswith(h.created.astimezone().strftime("%Y%m%d-"))
            and "_gemm_residual_rmsnorm_" in run_dir.name)

    attempts = reader.attempts()
    assert [a.outcome for a in attempts] == ["static_rejected", "wrong_output", "passed"]
    assert [a.round for a in attempts] == [1, 2, 3]
    assert all(a.raw_response and a.code and a.usage.input_tokens and "llm" in a.durations for a in attempts)
    assert "verify" in attempts[2].durations and attempts[2].verdict.stage("correctness").checks

    summary = reader.summary()
    assert summary.status == "target_reached" and summary.best_attempt == 3
    assert (summary.attempts, summary.passes, summary.rounds) == (3, 1, 3)
    assert summary.input_tokens == 5200 + 6900 + 8400 and summary.output_tokens == 310 + 290 + 280
    assert (summary.seconds_to_first_correct is not None
            and summary.wall_seconds >= summary.seconds_to_first_correct)
    assert reader.best_code() == attempts[2].code


def test_the_model_was_fed_each_previous_attempts_errors(recorded):
    first, second, third = RunReader(recorded[0]).attempts()
    assert [m.role for m in first.messages] == ["system", "user"]
    feedback2 = second.messages[-1].content
    assert second.messages[-2].content == first.raw_response.strip()
    assert "STATIC REJECTED" in feedback2 and "syntax error: expected ':'" in feedback2
    assert "`def fused(acc, c, gamma)`" in feedback2  # the offending line, quoted
    feedback3 = third.messages[-1].content
    assert "Attempt #2 (your reply above): WRONG OUTPUT" in feedback3
    assert "| `rstd` | NO |" in feedback3 and "| `h` | yes |" in feedback3
    assert "| 1 | 1 | static_rejected | line 5: syntax error: expected ':' |" in feedback3


def test_prompts_show_other_tasks_kernels_never_this_ones(recorded):
    system = RunReader(recorded[0]).attempts()[0].messages[0].content
    own = (TASK_DIR / "human/gemm_residual_rmsnorm.py").read_text().split('"""', 2)[2].strip()
    assert own not in system
    examples = RunReader(recorded[0]).header.params["examples"]
    for name in examples:  # as written, less the harness's pinned schedule
        kernel = unpinned((TASK_DIR / "human" / f"{name}.py").read_text()).split('"""', 2)[2].strip()
        assert kernel in system


def test_the_run_command_prints_the_record_and_the_verdict(tmp_path, capsys):
    code, out, _ = cli(capsys, "run", TASK_YAML, "--model", f"mock/{EXAMPLE_SCRIPT}", "--rounds", "1",
                       "--no-compile", "--runs-dir", str(tmp_path))
    assert code == 1  # one round: only the syntax error, so no correct candidate
    (run_dir,) = tmp_path.iterdir()
    assert f"record: {run_dir}" in out
    assert "#1   r1.0  static_rejected" in out
    assert "FAILED gemm_residual_rmsnorm v1: no correct candidate in 1 attempt" in out
    assert "stopped: 1 round done" in out


def test_an_attempt_line_keeps_the_longest_outcome_apart_from_its_reason():
    """over_launch_budget once ran into its reason ("over_launch_budgetat shape tiny")."""
    from coda_agent.cli.run_cmd import attempt_line
    from coda_agent.messages import ChatMessage
    from coda_agent.store.records import Attempt
    from coda_agent.verifier.verdict import Outcome, Verdict

    from .records_factory import T0

    for outcome in Outcome:
        verdict = Verdict(task="t", task_version=1, backend="torch", outcome=outcome, reason="at shape tiny")
        attempt = Attempt(index=1, round=1, slot=0, started=T0, finished=T0,
                          messages=[ChatMessage(role="user", content="task")], code="x = 1", verdict=verdict)
        line = attempt_line(attempt).plain
        assert f"r1.0  {outcome.value}  " in line, line
    # a long reason is cut at a word and marked (one ended "operand copies: 6; ho")
    reason = ("at shape tiny, forward() would launch about 6 kernels "
              + "operand copies: 6; host ops: none " * 6)
    verdict = Verdict(task="t", task_version=1, backend="torch", outcome=Outcome.OVER_LAUNCH_BUDGET,
                      reason=reason)
    attempt = Attempt(index=1, round=1, slot=0, started=T0, finished=T0,
                      messages=[ChatMessage(role="user", content="task")], code="x = 1", verdict=verdict)
    shown = attempt_line(attempt).plain.split("  · ")[0]
    assert shown.endswith(" …") and len(shown) < 200, shown
    assert shown[:-2].split()[-1] in reason.split(), shown  # a whole word before the mark


def test_resume_after_a_kill_redoes_only_the_unfinished_attempt(recorded, tmp_path, capsys):
    """A kill -9 during attempt 3 leaves attempts 1-2 and a 'running' summary; resume finishes the job."""
    run_dir = tmp_path / recorded[0].name
    shutil.copytree(recorded[0], run_dir)
    original = RunReader(run_dir).attempts()
    (run_dir / "attempts" / "0003.json").unlink()
    (run_dir / "best.py").unlink()
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**summary, "status": "running", "best_attempt": None}))
    kept = {n: (run_dir / "attempts" / n).read_bytes() for n in ("0001.json", "0002.json")}

    code, out, _ = cli(capsys, "run", "--resume", run_dir.name, "--runs-dir", str(tmp_path))
    assert code == 0, out
    assert "resuming after 2 finished attempt(s)" in out and "#3   r3.0  passed" in out
    assert all((run_dir / "attempts" / n).read_bytes() == data for n, data in kept.items())
    redone = RunReader(run_dir).attempts()
    assert [a.outcome for a in redone] == ["static_rejected", "wrong_output", "passed"]
    assert redone[2].messages == original[2].messages  # the conversation was rebuilt exactly
    assert RunReader(run_dir).summary().status == "target_reached"


def test_runs_recorded_before_the_suite_moved_still_resume_and_replay(recorded, tmp_path, capsys):
    """Older records name <repo>/tasks/<name>.yaml; the task is then found by name."""
    run_dir = tmp_path / recorded[0].name
    shutil.copytree(recorded[0], run_dir)
    header = json.loads((run_dir / "header.json").read_text())
    (run_dir / "header.json").write_text(
        json.dumps({**header, "task_path": "/old/checkout/tasks/gemm_residual_rmsnorm.yaml"}))
    (run_dir / "attempts" / "0003.json").unlink()
    code, out, err = cli(capsys, "run", "--resume", run_dir.name, "--runs-dir", str(tmp_path))
    assert code == 0, out + err
    code, out, err = cli(capsys, "run", "--model", f"replay/{run_dir}", "--no-compile", "--runs-dir",
                         str(tmp_path / "again"))
    assert code == 0, out + err


def test_replay_reproduces_a_recorded_runs_verdicts(recorded, tmp_path, capsys):
    code, out, _ = cli(capsys, "run", "--model", f"replay/{recorded[0]}", "--no-compile", "--runs-dir",
                       str(tmp_path))
    assert code == 0, out
    (replayed,) = tmp_path.iterdir()
    original = RunReader(recorded[0]).attempts()
    again = RunReader(replayed).attempts()
    assert [a.outcome for a in again] == [a.outcome for a in original]
    assert [a.code for a in again] == [a.code for a in original]
    assert RunReader(replayed).header.task == "gemm_residual_rmsnorm"
    assert RunReader(replayed).summary().cost_usd == 0


def test_replay_onto_another_version_of_its_task_says_so(recorded, tmp_path, capsys):
    """Replies written for one task replayed against an edited copy were re-verified without a word (a manual
    seat): a note names both."""
    import yaml

    from coda_agent.tasks import find_task

    original = find_task("gemm_residual_rmsnorm")
    data = yaml.safe_load(original.path.read_text())
    data.update(version=data["version"] + 1, reference=f"{original.reference_file}:reference", human=None)
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(data))
    _, out, err = cli(capsys, "run", str(edited), "--model", f"replay/{recorded[0]}", "--rounds", "1",
                         "--no-compile", "--runs-dir", str(tmp_path / "runs"))
    assert "note: the replies were written for task gemm_residual_rmsnorm v" in err, out + err
    assert f"v{data['version']} here is another" in err
    _, out, err = cli(capsys, "run", "--model", f"replay/{recorded[0]}", "--rounds", "1", "--no-compile",
                      "--runs-dir", str(tmp_path / "same"))
    assert "note: the replies" not in err


def test_replay_takes_a_run_id_or_a_unique_prefix(recorded, tmp_path, capsys):
    runs = tmp_path / "runs"
    shutil.copytree(recorded[0], runs / recorded[0].name)
    for ref in (recorded[0].name[-6:], recorded[0].name[:-1]):
        code, out, err = cli(capsys, "run", "--model", f"replay/{ref}", "--rounds", "1", "--no-compile",
                             "--runs-dir", str(runs))
        assert code == 1, out + err  # one round: the recorded syntax error
    code, _, err = cli(capsys, "run", "--model", "replay/nosuch", "--runs-dir", str(runs))
    assert code == 2 and "replay/nosuch: no run 'nosuch'" in err


def test_missing_or_bad_model_is_one_clear_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CODA_AGENT_MODEL", raising=False)
    code, _, err = cli(capsys, "run", TASK_YAML, "--runs-dir", str(tmp_path))
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: no model")
    for way in ("--model anthropic/", "openai/", "openai-compatible/", "--base-url", "mock/", "replay/",
                "manual", "CODA_AGENT_MODEL"):
        assert way in err
    code, _, err = cli(capsys, "run", TASK_YAML, "--model", "nosuch/model", "--runs-dir", str(tmp_path))
    assert (code == 2 and "unknown provider" in err and "manual[/<dir>]" in err
            and len(err.strip().splitlines()) == 1)
    code, _, err = cli(capsys, "run", "--resume", "nope", "--runs-dir", str(tmp_path))
    assert code == 2 and "no run 'nope'" in err
    assert not list(tmp_path.iterdir())
    code, _, err = cli(capsys, "run", TASK_YAML, "--model", "antropic/claude-sonnet-4-5", "--runs-dir",
                       str(tmp_path))
    assert (code == 2 and "(did you mean anthropic/claude-sonnet-4-5?)" in err
            and len(err.strip().splitlines()) == 1)


def test_a_run_record_given_as_the_task_names_resume(tmp_path, capsys):
    """A run's folder, a folder of runs or a sweep's file where a task goes: one line saying --resume
    continues it."""
    runs = tmp_path / "runs"
    run = make_run(runs)
    (runs / "s1.sweep.json").write_text("{}")
    for ref, what in ((str(run), "a run's record"), (run.name, "a run's record"),
                      (str(runs), "a folder of run records"),
                      (str(runs / "s1.sweep.json"), "a sweep's record")):
        code, _, err = cli(capsys, "run", ref, "--model", "mock/echo", "--runs-dir", str(runs))
        line = " ".join(err.split())
        assert code == 2 and what in line and "coda-agent run --resume" in line and err.count("\n") == 1, err
    assert sorted(p.name for p in runs.iterdir()) == sorted([run.name, "s1.sweep.json"])  # nothing started


def test_ctrl_c_marks_the_run_interrupted_and_says_how_to_resume(tmp_path):
    answers = tmp_path / "manual"
    env = {**os.environ, "CODA_AGENT_RUNS_DIR": str(tmp_path / "runs")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "coda_agent", "run", TASK_YAML, "--model", f"manual/{answers}",
         "--no-compile"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while not (answers / "prompt-1.md").exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert f"coda-agent run --resume {run_dir}" in err
    assert "Traceback" not in err
    assert RunReader(run_dir).summary().status == "interrupted"


def test_a_reader_that_leaves_the_pipe_does_not_end_the_run(tmp_path):
    """``coda-agent run ... | head -2``: the run goes on to its end, says once on stderr that stdout was
    closed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "coda_agent", "run", "gemm_residual_rmsnorm", "--model", f"mock/{SCRIPT}",
         "--no-compile", "--runs-dir", str(tmp_path / "runs")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("run ")
        proc.stdout.close()  # what head does after its lines
        err = proc.stderr.read() if proc.stderr else ""
        proc.wait(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert ("stdout was closed; carrying on" in err and "Traceback" not in err
            and "Exception ignored" not in err)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert RunReader(run_dir).summary().status == "target_reached"


def test_help_lists_every_option(capsys):
    code, out, _ = cli(capsys, "run", "--help")
    assert code == 0
    for option in ("--model", "--base-url", "--rounds", "--candidates", "--max-tokens-total", "--max-dollars",
                   "--max-wall", "--temperature", "--target-speedup", "--no-compile", "--runs-dir",
                   "--resume"):
        assert option in out


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def broken_task(tmp_path: Path, reference: str | None = None, **edits: object) -> Path:
    """A copy of gemm_residual_rmsnorm in tmp_path with another reference (None: none written) or YAML
    edits."""
    data = yaml.safe_load((TASK_DIR / "gemm_residual_rmsnorm.yaml").read_text())
    data.update(name="broken", reference="ref.py:reference", human=None, **edits)
    if reference is not None:
        (tmp_path / "ref.py").write_text(reference)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_broken_task_stops_before_any_model_call(tmp_path, capsys):
    runs = tmp_path / "runs"
    raising = broken_task(tmp_path, "def reference(**kw):\n    raise RuntimeError('reference bug')\n")
    code, _, err = cli(capsys, "run", str(raising), "--model", "mock/echo", "--runs-dir", str(runs))
    assert code == 2 and "the reference raised RuntimeError: reference bug" in err and err.count("\n") == 1
    human = TASK_DIR / "human" / "gemm_residual_rmsnorm.py"
    code, _, err = cli(capsys, "verify", str(raising), str(human))  # the task's fault, not the checker's
    assert code == 2 and "the reference raised RuntimeError: reference bug" in err and err.count("\n") == 1
    (tmp_path / "ref.py").unlink()
    code, _, err = cli(capsys, "run", str(raising), "--model", "mock/echo", "--runs-dir", str(runs))
    assert code == 2 and "reference: file ref.py not found" in err
    bad_sol = broken_task(tmp_path, "", sol={"flops": "2*M*N*K/(K-K)"})
    code, _, err = cli(capsys, "run", str(bad_sol), "--model", "mock/echo", "--runs-dir", str(runs))
    assert code == 2 and "shape bench/" in err and "sol.flops" in err and "Traceback" not in err
    code, _, err = cli(capsys, "validate", str(bad_sol))
    assert code == 1  # validate and run agree
    assert not runs.exists()  # no empty run directory left "running"


def test_examples_come_from_the_suite_and_the_places_named_never_the_tasks_folder(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    task = broken_task(mine, (TASK_DIR / "gemm_residual_rmsnorm.py").read_text())
    neighbour = yaml.safe_load((TASK_DIR / "gemm_rmsnorm.yaml").read_text())
    neighbour.update(name="my_rmsnorm", human="my_kernel.py")
    (mine / "my_rmsnorm.yaml").write_text(yaml.safe_dump(neighbour))
    shutil.copy(TASK_DIR / "gemm_rmsnorm.py", mine)
    mark = "# the user's own kernel, beside their other task"
    (mine / "my_kernel.py").write_text(mark + "\n" + (TASK_DIR / "human" / "gemm_rmsnorm.py").read_text())
    runs = tmp_path / "runs"

    def system_prompt(*extra: str) -> tuple[str, dict]:
        code, _, err = cli(capsys, "run", str(task), "--model", "mock/echo", "--rounds", "1", "--no-compile",
                           "--runs-dir", str(runs), *extra)
        assert code == 1, err
        run_dir = max(runs.iterdir(), key=lambda d: d.stat().st_mtime)
        reader = RunReader(run_dir)
        return reader.attempts()[0].messages[0].content, reader.header.params

    system, params = system_prompt()
    assert mark not in system and "my_rmsnorm" not in params["examples"] and params["example_places"] == []
    system, params = system_prompt("--examples-from", str(mine), "--examples", "my_rmsnorm,gemm_rope")
    assert (mark in system and params["examples"] == ["my_rmsnorm", "gemm_rope"]
            and params["example_places"] == [str(mine.resolve())])
    for bad, why in ((tmp_path / "nowhere", "no such file or folder"),
                     (mine / "my_kernel.py", "not a task file or folder")):
        code, _, err = cli(capsys, "run", str(task), "--model", "mock/echo", "--examples-from", str(bad),
                           "--runs-dir", str(runs))
        assert code == 2 and err.startswith(f"error: --examples-from {bad}: {why}") and err.count("\n") == 1


def test_run_checks_seeds_and_sets_the_verify_time_limit(tmp_path, capsys):
    code, _, err = cli(capsys, "run", "gemm_residual_rmsnorm", "--model", "mock/echo", "--seeds", "0",
                       "--runs-dir", str(tmp_path))
    assert code == 2 and "--seeds 0: must be at least 1" in err and err.count("\n") == 1
    for extra, limit in ((["--rounds", "1", "--no-compile"], 120),
                         (["--rounds", "1", "--no-compile", "--timeout", "42"], 42)):
        code, _, _ = cli(capsys, "run", "gemm_residual_rmsnorm", "--model", "mock/echo", *extra, "--runs-dir",
                         str(tmp_path / str(limit)))
        assert code == 1
        (run_dir,) = (tmp_path / str(limit)).iterdir()
        assert RunReader(run_dir).header.params["verify_timeout"] == limit


def test_an_unreachable_server_stops_the_run_at_once(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CODA_AGENT_RETRY_BASE_DELAY", "0")
    url = f"http://127.0.0.1:{closed_port()}/v1"
    code, _, err = cli(capsys, "run", "gemm_residual_rmsnorm", "--model", "openai-compatible/qwen",
                       "--base-url", url, "--no-compile", "--runs-dir", str(tmp_path))
    assert code == 2, err
    first, *rest = err.splitlines()
    assert (first.startswith(f"error: openai-compatible/qwen: cannot connect to {url}")
            and "is the server up" in first)
    assert len(rest) == 1 and "--resume" in rest[0]  # nothing else: no retries, no traceback
    (run_dir,) = tmp_path.iterdir()
    assert RunReader(run_dir).attempts() == [] and RunReader(run_dir).summary().status == "failed"


def test_sigterm_marks_the_run_interrupted_and_bare_manual_works_in_the_run_directory(tmp_path):
    env = {**os.environ, "CODA_AGENT_RUNS_DIR": str(tmp_path / "runs"), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "coda_agent", "run", TASK_YAML, "--model", "manual", "--no-compile"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("runs/*/manual/prompt-1.md")):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # no coda-manual/ in the working folder
    assert "Traceback" not in err and f"coda-agent run --resume {run_dir}" in err
    summary = RunReader(run_dir).summary()
    assert summary.status == "interrupted" and "SIGTERM" in summary.stop_reason


def test_resume_with_a_corrupt_attempt_says_how_to_redo_it(recorded, tmp_path, capsys):
    run_dir = tmp_path / recorded[0].name
    shutil.copytree(recorded[0], run_dir)
    (run_dir / "attempts" / "0002.json").write_text('{"index": 2, "trunc')
    code, _, err = cli(capsys, "run", "--resume", run_dir.name, "--runs-dir", str(tmp_path))
    assert code == 2 and "0002.json: unreadable attempt file" in err and "--redo-corrupt" in err
    code, out, err = cli(capsys, "run", "--resume", run_dir.name, "--redo-corrupt", "--runs-dir",
                         str(tmp_path))
    assert code == 0, out + err
    assert "set aside 2 attempt file(s) to redo: 0002.json, 0003.json" in err
    assert ((run_dir / "attempts" / "0002.json.corrupt").exists()
            and (run_dir / "attempts" / "0003.json.superseded").exists())
    assert [a.outcome for a in RunReader(run_dir).attempts()] == ["static_rejected", "wrong_output", "passed"]


def test_a_run_on_an_unpriced_model_shows_unpriced_not_zero_dollars(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CODA_AGENT_PRICES", raising=False)
    server = FakeLLMServer().start()
    try:
        server.reply(OPENAI_PATH, openai_chat("no code here", model="qwen"))
        code, out, _ = cli(capsys, "run", "gemm_residual_rmsnorm", "--model", "openai-compatible/qwen",
                           "--base-url", f"{server.url}/v1", "--rounds", "1", "--no-compile", "--runs-dir",
                           str(tmp_path))
    finally:
        server.stop()
    assert code == 1
    assert "unpriced" in out.splitlines()[-2] and "$0" not in out  # the totals line, and the attempt line
    (run_dir,) = tmp_path.iterdir()
    assert RunReader(run_dir).summary().cost_known is False


def _how_it_ended(proc: subprocess.Popen, runs: Path) -> str:
    """A run that ended before its runner was seen: its exit, its stderr and each attempt's verdict, in
    full."""
    out, err = proc.communicate(timeout=60)
    verdicts = [(a.index, a.verdict.outcome if a.verdict else None,
                 a.verdict.reason if a.verdict else a.provider_error)
                for run in runs.iterdir() for a in RunReader(run).attempts()] if runs.is_dir() else []
    return f"exit {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}\nattempts: {verdicts}"


def test_sigterm_ends_a_verification_in_flight_at_once(tmp_path, procs):
    """A candidate that never returns does not hold an interrupted run until its time limit."""
    human = (TASK_DIR / "human" / "gemm_residual_rmsnorm.py").read_text()
    spinning = human.replace("    out = gemm(", "    while True:\n        pass\n    out = gemm(")
    script = tmp_path / "spin.yaml"
    script.write_text(yaml.safe_dump({"responses": [{"text": f"```python\n{spinning}```\n"}]}))
    env = {**os.environ, "CODA_AGENT_RUNS_DIR": str(tmp_path / "runs"), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "coda_agent", "run", TASK_YAML, "--model", f"mock/{script}", "--no-compile",
         "--timeout", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(b"coda_agent.runner" in procs.cmdline(p)
                      and procs.cmdline(p).startswith(sys.executable.encode())
                      for p in procs.descendants(proc.pid)):
            assert time.monotonic() < deadline and proc.poll() is None, _how_it_ended(proc, tmp_path / "runs")
            time.sleep(0.2)
        time.sleep(1.0)
        t0 = time.monotonic()
        proc.terminate()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert proc.returncode == 143 and took < 15, (took, err)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert RunReader(run_dir).summary().status == "interrupted"


def test_a_gpu_run_tunes_each_candidate_by_default_within_its_budget(tmp_path, capsys, monkeypatch):
    from coda_agent.agent import Agent, loop
    from coda_agent.cli.run_cmd import RunOptions
    from coda_agent.providers import MockProvider
    from coda_agent.tasks import find_task
    from coda_agent.verifier import DEFAULT_TUNE_BUDGET_S

    task = find_task(TASK_YAML)
    # no GPU here: nothing is timed, nothing tuned
    assert RunOptions().config(task, "mock/x").tune_budget_s is None
    monkeypatch.setattr(loop, "gpu_verifier_available", lambda: True)
    assert RunOptions().config(task, "mock/x").tune_budget_s == DEFAULT_TUNE_BUDGET_S
    assert RunOptions(no_tune=True).config(task, "mock/x").tune_budget_s is None
    cfg = RunOptions(tune_budget=45).config(task, "mock/x")
    monkeypatch.setattr(loop, "session_peaks", lambda config: loop.NOMINAL_H200)
    agent = Agent.create(task, MockProvider(["unused"]), cfg, tmp_path)
    # a timed job, budget 45 s
    assert agent.tune_fn == agent._tune_on_executor and agent.config.tune_budget_s == 45
    assert agent.header.params["tune_budget_s"] == 45
    code, _, err = cli(capsys, "run", TASK_YAML, "--model", "mock/x", "--no-tune", "--tune-budget", "30",
                       "--runs-dir", str(tmp_path))
    assert code == 2 and "--no-tune and --tune-budget contradict each other" in err and err.count("\n") == 1
