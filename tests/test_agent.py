"""The agent loop on a real task: budgets, errors, concurrency, interruption and resume, GPU plumbing.

Most replies here are refused by the static check (no worker process), so these tests stay fast; the
end-to-end runs through the real verifier are in test_agent_cli.py and test_agent_compile below.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from coda_agent.agent import Agent, AgentConfig, Extraction, FatalProviderError, RunEvents, extract_code
from coda_agent.agent import loop as agent_loop
from coda_agent.measure.timing import Timing
from coda_agent.messages import ChatMessage
from coda_agent.providers import Completion, MockProvider
from coda_agent.store.records import Budgets, RunSummary
from coda_agent.store.rundir import RunReader
from coda_agent.tasks import Task, TaskError, find_task
from coda_agent.verifier import NO_CANDIDATE, Plan, Tuned, verify
from coda_agent.verifier.verdict import Outcome, ShapeTiming, StageResult, Verdict

from .conftest import EXAMPLE_SCRIPT as SCRIPT
from .conftest import TASK_DIR

TASK = find_task("gemm_residual_rmsnorm")
CORRECT = yaml.safe_load(SCRIPT.read_text())["responses"][-1]["text"]
REFUSED = "```python\nimport os\n\n\ndef forward(x, w, residual, gamma, eps):\n    return {}\n```"


def config(**kw) -> AgentConfig:
    budgets = Budgets(**{k: kw.pop(k) for k in list(kw) if k in Budgets.model_fields})
    return AgentConfig(model="mock/test", plan=Plan(), budgets=budgets, **kw)


def run(agent: Agent):
    return asyncio.run(agent.run())


def round_of(messages: list[ChatMessage]) -> int:
    """Which round a prompt belongs to: 1 + the attempts it reports on (resume-safe, unlike call order)."""
    if len(messages) == 2:
        return 1
    first = messages[-1].content.split("\n")[2]  # "N attempts so far, ..."
    return int(first.split()[0]) + 1


def test_rounds_budget_and_concurrent_candidates(tmp_path):
    in_flight, peak = 0, 0

    async def reply(messages):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return REFUSED

    provider = MockProvider(reply)
    agent = Agent.create(TASK, provider, config(rounds=2, candidates_per_round=3), tmp_path)
    summary = run(agent)
    assert peak == 3, "the K candidates of a round must be asked concurrently"
    assert summary.status == "completed" and summary.stop_reason == "all 2 rounds done"
    attempts = RunReader(agent.run_dir).attempts()
    assert ([(a.index, a.round, a.slot) for a in attempts]
            == [(1, 1, 0), (2, 1, 1), (3, 1, 2), (4, 2, 0), (5, 2, 1), (6, 2, 2)])
    assert summary.outcomes == {"static_rejected": 6} and summary.passes == 0 and summary.best_attempt is None
    # round 2 sees round 1's results; the three candidates of a round get the same prompt, each asked for its
    # own approach
    assert attempts[3].messages[:-1] == attempts[4].messages[:-1] == attempts[5].messages[:-1]
    lasts = [a.messages[-1].content for a in attempts[3:]]
    assert len({text.split("You are candidate")[0] for text in lasts}) == 1
    one = Agent.create(TASK, MockProvider([REFUSED]), config(rounds=1), tmp_path)
    assert run(one).stop_reason == "1 round done"  # not "all 1 round done"
    assert [f"You are candidate {i} of 3" in text for i, text in enumerate(lasts, 1)] == [True] * 3
    assert len({text.split("Yours: ")[1] for text in lasts}) == 3
    assert "import of 'os' is not allowed" in attempts[3].messages[-1].content
    assert not (agent.run_dir / "best.py").exists()


def test_token_budget_is_a_hard_stop_that_shrinks_the_last_round(tmp_path):
    provider = MockProvider([{"text": REFUSED, "input_tokens": 900, "output_tokens": 100}] * 10)
    agent = Agent.create(TASK, provider, config(rounds=10, candidates_per_round=2, max_tokens=3500), tmp_path)
    summary = run(agent)
    assert summary.status == "budget_exhausted" and "token budget" in summary.stop_reason
    assert summary.attempts == 3  # 2 + 1: the second round could pay for one more attempt only
    assert summary.input_tokens + summary.output_tokens == 3000 <= 3500
    assert len(provider.calls) == 3


def test_dollar_budget_uses_the_providers_cost(tmp_path):
    provider = MockProvider(
        lambda messages: Completion(text=REFUSED, model="m", input_tokens=10, output_tokens=10, cost_usd=0.4))
    agent = Agent.create(TASK, provider, config(rounds=10, max_dollars=1.0), tmp_path)
    summary = run(agent)
    assert summary.status == "budget_exhausted" and "dollar budget" in summary.stop_reason
    assert summary.attempts == 2 and summary.cost_usd == pytest.approx(0.8)
    assert RunReader(agent.run_dir).attempts()[0].usage.cost_usd == pytest.approx(0.4)


class Notes(RunEvents):
    """Run events that keep the notes."""

    def __init__(self):
        self.notes = []

    def note(self, message):
        self.notes.append(message)


def test_an_unpriced_model_under_a_dollar_budget_is_flagged(tmp_path):
    events = Notes()
    unpriced = MockProvider(
        lambda m: Completion(text=REFUSED, model="m", input_tokens=5, output_tokens=5, price_known=False))
    run(Agent.create(TASK, unpriced, config(rounds=2, max_dollars=1.0), tmp_path, events=events))
    assert len(events.notes) == 1 and "no known price" in events.notes[0]


def test_wall_time_budget_abandons_attempts_in_flight(tmp_path):
    async def slow(messages):
        await asyncio.sleep(0.3)
        return REFUSED

    agent = Agent.create(TASK, MockProvider(slow), config(rounds=10, max_wall_seconds=0.5), tmp_path)
    t0 = time.monotonic()
    summary = run(agent)
    assert time.monotonic() - t0 < 5
    assert summary.status == "budget_exhausted" and "wall-time" in summary.stop_reason
    assert summary.attempts == 1


def test_a_reply_without_code_is_a_recorded_attempt_and_fed_back(tmp_path):
    provider = MockProvider(["I would need to know more about the hardware first.", REFUSED])
    agent = Agent.create(TASK, provider, config(rounds=2), tmp_path)
    summary = run(agent)
    first, second = RunReader(agent.run_dir).attempts()
    assert first.outcome == "no_code" and first.code is None and first.verdict is None
    assert "no ```python block" in first.extraction_error
    assert "Attempt #1 (your reply above): NO CODE" in second.messages[-1].content
    assert summary.outcomes == {"no_code": 1, "static_rejected": 1}


def test_the_first_prompt_without_a_run_is_the_one_a_run_sends(tmp_path, capsys):
    """``coda-agent prompt`` (a manual-seat author had to start a run and leave it waiting to read it) prints
    exactly the first chat a run records."""
    from coda_agent.agent.loop import first_messages

    from .conftest import cli

    agent = Agent.create(TASK, MockProvider([REFUSED]), config(rounds=1), tmp_path)
    run(agent)
    (first,) = RunReader(agent.run_dir).attempts()
    assert [m.role for m in first.messages] == ["system", "user"]
    assert first_messages(TASK, agent.config) == first.messages
    code, out, err = cli(capsys, "prompt", TASK.name, "--no-compile")
    assert code == 0, err
    assert out.startswith("===== system =====\n\n") and "\n\n===== user =====\n\n" in out
    assert first.messages[1].content.rstrip() in out and "There is no GPU in this run" in out


def test_the_event_loop_runs_on_while_a_reply_is_being_read(tmp_path, monkeypatch):
    """Reading a reply is off the event loop, so other runs and Ctrl-C never wait on it: a stand-in extractor
    holds until a coroutine on the loop answers, which it could not do were the reading blocking the loop
    (then the wait runs out and the test fails; it never hangs)."""
    reading, answered = threading.Event(), threading.Event()
    answered_in_time: list[bool] = []

    def held(text: str) -> Extraction:
        reading.set()
        answered_in_time.append(answered.wait(timeout=10))
        return extract_code(text)

    monkeypatch.setattr(agent_loop, "extract_code", held)

    async def main() -> RunSummary:
        run = asyncio.create_task(
            Agent.create(TASK, MockProvider(["no code here"]), config(rounds=1), tmp_path).run())
        while not reading.is_set() and not run.done():
            await asyncio.sleep(0.01)
        answered.set()
        return await run

    summary = asyncio.run(main())
    assert answered_in_time == [True] and summary.outcomes == {"no_code": 1}


def test_provider_errors_are_recorded_attempts_but_fatal_ones_stop_the_run(tmp_path):
    provider = MockProvider([{"error": "rate_limit", "message": "429 slow down"}, REFUSED])
    agent = Agent.create(TASK, provider, config(rounds=2), tmp_path / "a")
    run(agent)
    failed, refused = RunReader(agent.run_dir).attempts()
    assert failed.outcome == "provider_error" and failed.provider_error == "rate_limit: 429 slow down"
    assert [m.role for m in refused.messages] == ["system", "user"]  # nothing to feed back yet

    fatal = MockProvider([{"error": "auth", "message": "invalid x-api-key"}])
    agent = Agent.create(TASK, fatal, config(rounds=3), tmp_path / "b")
    with pytest.raises(FatalProviderError, match="invalid x-api-key"):
        run(agent)
    reader = RunReader(agent.run_dir)
    assert reader.attempts() == []
    assert reader.summary().status == "failed" and "invalid x-api-key" in reader.summary().stop_reason


def test_interrupt_then_resume_loses_nothing(tmp_path):
    hold = None

    async def reply(messages):
        if round_of(messages) == 2:
            await hold.wait()  # never set: the run is interrupted here
        return REFUSED

    async def interrupted(agent: Agent) -> None:
        nonlocal hold
        hold = asyncio.Event()
        task = asyncio.create_task(agent.run())
        while len(provider.calls) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    provider = MockProvider(reply)
    agent = Agent.create(TASK, provider, config(rounds=2), tmp_path)
    asyncio.run(interrupted(agent))
    reader = RunReader(agent.run_dir)
    assert reader.summary().status == "interrupted" and [a.index for a in reader.attempts()] == [1]
    first = (agent.run_dir / "attempts" / "0001.json").read_bytes()

    again = MockProvider([REFUSED])
    summary = run(Agent.resume(agent.run_dir, again))
    assert len(again.calls) == 1, "the finished attempt must not be redone"
    assert (agent.run_dir / "attempts" / "0001.json").read_bytes() == first
    assert summary.status == "completed" and summary.attempts == 2
    assert "import of 'os'" in RunReader(agent.run_dir).attempts()[1].messages[-1].content


KILLED_RUN = """
import asyncio, sys
from pathlib import Path
from coda_agent.agent import Agent, AgentConfig
from coda_agent.providers import MockProvider
from coda_agent.store.records import Budgets
from coda_agent.measure.timing import Timing
from coda_agent.tasks import Task, TaskError, find_task
from coda_agent.verifier import Plan, verify

REFUSED = {refused!r}

async def reply(messages):
    if len(messages) > 2 and messages[-1].content.split("\\n")[2].startswith("2 attempts"):
        await asyncio.sleep(3600)  # round 3 never answers: the process is killed here
    return REFUSED

agent = Agent.create(find_task("gemm_residual_rmsnorm"), MockProvider(reply),
                     AgentConfig(model="mock/test", plan=Plan(), budgets=Budgets(rounds=3)),
                     Path(sys.argv[1]))
print(agent.run_dir, flush=True)
asyncio.run(agent.run())
"""


def test_resume_after_kill_9_redoes_only_the_attempt_in_flight(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(KILLED_RUN.format(refused=REFUSED))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "runs")], stdout=subprocess.PIPE,
                            text=True)
    try:
        run_dir = Path(proc.stdout.readline().strip())
        deadline = time.monotonic() + 120
        while not (run_dir / "attempts" / "0002.json").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the run did not get to attempt 2"
            time.sleep(0.05)
        time.sleep(0.3)  # round 3 is now waiting for its reply
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    before = {p.name: p.read_bytes() for p in (run_dir / "attempts").glob("*.json")}
    assert sorted(before) == ["0001.json", "0002.json"]
    assert RunReader(run_dir).summary().status == "running"  # what kill -9 leaves behind

    provider = MockProvider([REFUSED])
    summary = run(Agent.resume(run_dir, provider))
    assert len(provider.calls) == 1
    assert all((run_dir / "attempts" / name).read_bytes() == data for name, data in before.items())
    assert summary.status == "completed" and summary.attempts == 3
    third = RunReader(run_dir).attempts()[2]
    assert third.round == 3 and "2 attempts so far" in third.messages[-1].content


# --- the GPU path, with a stand-in verifier (no GPU here) ---------------------------------------


GPU_PLAN = Plan(stages=["gpu_correctness", "profile"], backend="quack", shape_set="bench")


def fake_gpu_verify(task, source, plan):
    """A GPU verdict: gpu_correctness passes, profile times the candidate (its code says how fast)."""
    us = 1000.0 if source == task.human_file.read_text() else (2000.0 if "SLOW" in source else 900.0)
    shapes = {
        p.name: {"candidate": {"median_us": us}, "eager": {"median_us": 3000.0}}
        for p in task.shape("bench")[:2]}
    stage_results = [
        StageResult(stage="static", outcome=Outcome.PASSED),
        StageResult(stage="gpu_correctness", outcome=Outcome.PASSED),
        StageResult(stage="profile", outcome=Outcome.PASSED, details={"shapes": shapes}),
    ]
    assert plan.stages == ["gpu_correctness", "profile"] and plan.shape_set == "bench"
    return Verdict(task=task.name, task_version=task.version, backend="quack", outcome=Outcome.PASSED,
                   stages=stage_results)


def test_gpu_path_times_the_human_kernel_keeps_the_fastest_and_stops_at_the_speed_target(tmp_path):
    slow = CORRECT.replace("def forward(", "# SLOW first version\ndef forward(")
    provider = MockProvider([slow, CORRECT])
    cfg = AgentConfig(model="mock/test", plan=GPU_PLAN, budgets=Budgets(rounds=5), target_speedup=1.05)
    agent = Agent.create(TASK, provider, cfg, tmp_path, verify_fn=fake_gpu_verify)
    summary = run(agent)
    reader = RunReader(agent.run_dir)
    assert reader.header.human_timing == {"llama3-8b-down": 1000.0, "llama3-1b-down": 1000.0}
    assert reader.header.target == {"correct": True, "speedup_vs_human": 1.05}
    first, second = reader.attempts()
    assert first.timing["speedup_vs_human"] == pytest.approx(0.5) and first.passed
    assert summary.status == "target_reached" and summary.best_attempt == 2
    assert (summary.speedup_vs_human == pytest.approx(1000 / 900)
            and summary.best_time_us == pytest.approx(900))
    assert reader.best_code() == second.code
    task_message, feedback = second.messages[1].content, second.messages[-1].content
    assert "The hand-written kernel for this task runs at" in task_message and "1000.0 µs" in task_message
    assert "at least 1.05x the speed of the hand-written kernel" in task_message
    assert ("| llama3-8b-down | 2000.0 | 1000.0 | 0.50x | 1.50x | 972.8 | 49% |" in feedback
            and "make it faster" in feedback)


# --- speed targets and search, with a fake timing backend --------------------------------------


def timed(us: int) -> str:
    """The correct reply, marked with the time the fake backend gives it (a constant: a distinct
    candidate)."""
    return CORRECT.replace("def forward(", f"TIME_US = {us}\n\n\ndef forward(", 1)


def fake_timing_backend(*, cublas: float | None = 1000.0, human_fails: bool = False,
                        jobs: list | None = None):
    """A verify function whose profile stage reports typed timings: a candidate runs at its ``TIME_US``,
    cuBLAS alone at ``cublas`` and torch.compile at 1500 µs at every bench shape. The harness's job that
    builds the baselines passes; ``jobs`` collects every job's (stages, compile modes, source)."""

    def verify_fn(task, source, plan):
        if jobs is not None:
            jobs.append((plan.stages, plan.compile_modes, source))
        if plan.stages == ["bench_prepare"]:
            return Verdict(task=task.name, task_version=task.version, backend="quack", outcome=Outcome.PASSED,
                           stages=[StageResult(stage="bench_prepare", outcome=Outcome.PASSED)])
        assert plan.stages == GPU_PLAN.stages and plan.shape_set == "bench"
        human = task.human_file is not None and source == task.human_file.read_text()
        if human and human_fails:
            return Verdict(task=task.name, task_version=task.version, backend="quack",
                           outcome=Outcome.WRONG_OUTPUT)
        found = re.search(r"^TIME_US = (\d+)$", source, re.MULTILINE)
        us = float(found.group(1)) if found else 1000.0
        timings = {
            p.name: ShapeTiming(
                dims=p.dims, candidate=Timing(median_us=us), compiled=Timing(median_us=1500.0),
                cublas=Timing(median_us=cublas) if cublas else None,
            )
            for p in task.shape("bench")
        }
        stage_results = [
            StageResult(stage="static", outcome=Outcome.PASSED),
            StageResult(stage="gpu_correctness", outcome=Outcome.PASSED),
            StageResult(stage="profile", outcome=Outcome.PASSED, timings=timings),
        ]
        return Verdict(task=task.name, task_version=task.version, backend="quack", outcome=Outcome.PASSED,
                       stages=stage_results)

    return verify_fn


def task_without_human_kernel(folder: Path) -> Task:
    folder.mkdir()
    (folder / "gemm_residual_rmsnorm.yaml").write_text(
        (TASK_DIR
         / "gemm_residual_rmsnorm.yaml").read_text().replace("human: human/gemm_residual_rmsnorm.py\n", "")
    )
    (folder / "gemm_residual_rmsnorm.py").write_text((TASK_DIR / "gemm_residual_rmsnorm.py").read_text())
    return find_task(str(folder / "gemm_residual_rmsnorm.yaml"))


def test_without_a_human_kernel_the_run_improves_over_rounds_until_it_reaches_the_cublas_target(tmp_path):
    task = task_without_human_kernel(tmp_path / "mine")
    provider = MockProvider([timed(2000), timed(1250), timed(1020), timed(900)])
    cfg = AgentConfig(model="mock/test", budgets=Budgets(rounds=6), plan=GPU_PLAN)
    jobs: list = []
    events = Notes()
    agent = Agent.create(task, provider, cfg, tmp_path / "runs", verify_fn=fake_timing_backend(jobs=jobs),
                         events=events)
    summary = run(agent)
    reader = RunReader(agent.run_dir)
    # the baselines were built once, by a job of the harness's own that loads no candidate, beside the first
    # model call (the first attempt's job comes after it); every other job verified a candidate
    assert jobs[0] == (["bench_prepare"], ["default"], NO_CANDIDATE)
    assert [j for j in jobs[1:] if j[0] != GPU_PLAN.stages] == []
    assert any(n.startswith("the baselines are built") for n in events.notes)
    assert (reader.header.target == {"correct": True, "speedup_vs_cublas": 0.97}
            and reader.header.human_timing == {})
    # not stopped at the first correct candidate (0.5x cuBLAS): on until 1000/1020 = 0.98x
    assert summary.status == "target_reached" and len(provider.calls) == 3 and summary.best_attempt == 3
    assert summary.speedup_vs_cublas == pytest.approx(1000 / 1020) and summary.speedup_vs_human is None
    first, second, third = reader.attempts()
    assert first.passed and first.timing["speedup_vs_cublas"] == pytest.approx(0.5)
    assert first.timing["speedup_vs_compiled"] == pytest.approx(0.75)
    assert reader.best_code() == third.code
    assert "at least 0.97x the speed of the task's GEMMs alone in cuBLAS" in first.messages[1].content
    feedback2, feedback3 = second.messages[-1].content, third.messages[-1].content
    assert ("| shape | yours µs | human µs | vs human | vs cuBLAS alone | vs torch.compile | SoL µs | % of "
            "SoL | bound |") in feedback2
    assert "| llama3-8b-down | 2000.0 | - | - | 0.50x | 0.75x | 972.8 | 49% | compute |" in feedback2
    assert "Target: 0.97x of cuBLAS alone (geomean over the bench shapes); the best is at 0.50x." in feedback2
    assert "Farthest behind: `llama3-8b-down` at 0.50x, compute-bound" in feedback2
    # round 3 sees both correct candidates, the faster first, each with its code
    assert "| 2 | 2 | 1250.0 | - | 0.80x |" in feedback3 and "| 1 | 1 | 2000.0 | - | 0.50x |" in feedback3
    assert feedback3.index("| 2 | 2 | 1250.0") < feedback3.index("| 1 | 1 | 2000.0")
    assert "### Attempt #1: correct, 0.50x cuBLAS alone" in feedback3 and "TIME_US = 2000" in feedback3
    assert "TIME_US = 1250" in third.messages[-2].content  # the lead reply: the best of the last round


def test_a_human_kernel_that_cannot_be_timed_leaves_the_cublas_target(tmp_path):
    provider = MockProvider([timed(1020)])
    cfg = AgentConfig(model="mock/test", budgets=Budgets(rounds=2), plan=GPU_PLAN)
    jobs: list = []
    agent = Agent.create(TASK, provider, cfg, tmp_path,
                         verify_fn=fake_timing_backend(human_fails=True, jobs=jobs))
    assert agent.header.target == {"correct": True, "speedup_vs_human": 0.97}
    summary = run(agent)
    assert RunReader(agent.run_dir).header.target == {"correct": True, "speedup_vs_cublas": 0.97}
    assert summary.status == "target_reached" and summary.best_attempt == 1
    # a task with a human kernel gets no job of the harness's own: timing the human kernel is that job
    assert [stages for stages, _, _ in jobs] == [GPU_PLAN.stages, GPU_PLAN.stages]


def test_a_target_the_timings_cannot_judge_runs_to_the_budget(tmp_path):
    """No cuBLAS baseline in the timings: a correct candidate is not taken as on target; the rounds run
    out."""
    task = task_without_human_kernel(tmp_path / "mine")
    provider = MockProvider([timed(1200), timed(1100)])
    cfg = AgentConfig(model="mock/test", budgets=Budgets(rounds=2), plan=GPU_PLAN)
    agent = Agent.create(task, provider, cfg, tmp_path / "runs", verify_fn=fake_timing_backend(cublas=None))
    summary = run(agent)
    assert summary.status == "completed" and summary.passes == 2 and summary.best_attempt == 2


def test_the_tune_hook_pins_a_correct_candidates_configs_and_the_tuned_module_ships(tmp_path):
    """A stand-in tuner (the GPU one is the harness's job): it rewrites the candidate's timing marker, as
    pinning a faster config would; the tuned module is verified and timed like any candidate, and adopted when
    faster."""
    seen = []

    def tune(task, source, verdict):
        seen.append(verdict.passed)
        return Tuned(
            source.replace("TIME_US = 1250", "TIME_US = 1000").replace("TIME_US = 900", "TIME_US = 950"))

    task = task_without_human_kernel(tmp_path / "mine")
    provider = MockProvider([timed(900), timed(1250)])
    budgets = Budgets(rounds=1, candidates_per_round=2)
    cfg = AgentConfig(model="mock/test", budgets=budgets, target_speedup=1.05, plan=GPU_PLAN)
    agent = Agent.create(task, provider, cfg, tmp_path / "runs", verify_fn=fake_timing_backend(),
                         tune_fn=tune)
    summary = run(agent)
    reader = RunReader(agent.run_dir)
    fast, tuned = reader.attempts()
    assert seen == [True, True]
    # 900 µs "tuned" to 950 µs: slower, so not adopted; the model's module stands
    assert (fast.tuning is not None and not fast.tuning.adopted
            and fast.timing["geomean_us"] == pytest.approx(900))
    # 1250 µs tuned to 1000 µs: adopted; before and after are both on record
    assert tuned.tuning.adopted and tuned.tuning.before["speedup_vs_cublas"] == pytest.approx(0.8)
    assert tuned.timing["speedup_vs_cublas"] == pytest.approx(1.0) and "tune" in tuned.durations
    assert tuned.shipped_code == tuned.tuning.code != tuned.code
    assert summary.best_attempt == 1 and reader.best_code() == fast.code


def test_a_tuned_candidate_can_become_the_best_and_reach_the_target(tmp_path):
    task = task_without_human_kernel(tmp_path / "mine")
    provider = MockProvider([timed(1250)])
    cfg = AgentConfig(model="mock/test", budgets=Budgets(rounds=3), plan=GPU_PLAN)
    agent = Agent.create(task, provider, cfg, tmp_path / "runs", verify_fn=fake_timing_backend(),
                         tune_fn=lambda task, source, verdict: Tuned(source.replace("TIME_US = 1250",
                                                                                    "TIME_US = 1000")))
    summary = run(agent)
    assert summary.status == "target_reached" and summary.speedup_vs_cublas == pytest.approx(1.0)
    assert "TIME_US = 1000" in RunReader(agent.run_dir).best_code()


def test_the_harness_tuner_pins_configs_that_ship_in_best_py_and_reach_the_feedback(tmp_path, monkeypatch):
    """The real tuner (the tune stage on the emulator, a deterministic clock) pins its winner on forward; the
    fake GPU backend times a scheduled module faster; the loop adopts it, best.py carries it, the next prompt
    names it."""
    from coda_agent.primitives import Config
    from coda_agent.verifier import tune_plan, tune_schedule, tuning
    from coda_agent.verifier.static.schedule_source import pinned_schedule

    winner = Config(tile_m=256, tile_n=160, pingpong=False, cluster_m=1, cluster_n=2)

    class Deterministic(tuning.ScheduleTimer):
        def measure(self, table):
            return Timing(median_us=100.0 if winner in table.values() else 120.0)

        def compare(self, table):
            return self.measure({}), self.measure(table)

    monkeypatch.setattr(tuning, "ScheduleTimer", Deterministic)
    task = task_without_human_kernel(tmp_path / "mine")
    gpu = fake_timing_backend()

    def verify_fn(task, source, plan):
        pinned = "@schedule(" in source
        return gpu(task, source.replace("TIME_US = 1250", "TIME_US = 1000") if pinned else source, plan)

    tune_fn = functools.partial(tune_schedule, plan=tune_plan("tune_cpu", "small", 60))
    provider = MockProvider([timed(1250), timed(1250)])
    cfg = AgentConfig(model="mock/test", budgets=Budgets(rounds=2), target_speedup=1.5, plan=GPU_PLAN)
    agent = Agent.create(task, provider, cfg, tmp_path / "runs", verify_fn=verify_fn, tune_fn=tune_fn)
    run(agent)
    reader = RunReader(agent.run_dir)
    first = reader.attempts()[0]
    assert (first.tuning is not None and first.tuning.adopted
            and first.timing["geomean_us"] == pytest.approx(1000))
    # on record
    assert first.tuning.search and all(c.tried_us for s in first.tuning.search.values() for c in s.calls)
    pinned = pinned_schedule(reader.best_code())
    assert set(pinned.values()) == {winner} and {k[0] for k in pinned} == {"fused"}
    assert verify(task, reader.best_code(), Plan(seeds=[0])).passed
    assert ("once the harness tuned its configs (from 1250.0 µs; pinned: fused 200x320x96: 256x160 coop 1x2; "
            "fused 256x384x128") in (
        reader.attempts()[1].messages[-1].content
    )


def test_a_search_that_finds_nothing_faster_is_still_on_record_with_where_its_time_went(tmp_path, monkeypatch,
                                                                                       capsys):
    """At the H200 (2026-12-05) two acceptance runs tuned 40 s, found nothing, and their records said nothing
    of it: no search, no time by part. Now the search and the tune stage stay on the attempt, not adopted, and
    ``show --breakdown`` lists the stage's parts beside the verifier's."""
    from coda_agent.cli import main
    from coda_agent.verifier import tune_plan, tune_schedule, tuning

    class Flat(tuning.ScheduleTimer):
        def measure(self, table):
            return Timing(median_us=120.0)

        def compare(self, table):
            return self.measure({}), self.measure(table)

    monkeypatch.setattr(tuning, "ScheduleTimer", Flat)
    task = task_without_human_kernel(tmp_path / "mine")
    tune_fn = functools.partial(tune_schedule, plan=tune_plan("tune_cpu", "small", 60))
    cfg = AgentConfig(model="mock/test", budgets=Budgets(rounds=1), target_speedup=1.5, plan=GPU_PLAN)
    agent = Agent.create(task, MockProvider([timed(1250)]), cfg, tmp_path / "runs",
                         verify_fn=fake_timing_backend(), tune_fn=tune_fn)
    run(agent)
    (first,) = RunReader(agent.run_dir).attempts()
    tuned = first.tuning
    assert tuned is not None and not tuned.adopted and tuned.code is None and tuned.verdict is None
    assert tuned.search and all(len(c.tried_us) > 1 for s in tuned.search.values() for c in s.calls)
    stage = tuned.stage
    assert stage is not None and stage.stage == "tune_cpu" and "search" in stage.seconds_by_part
    assert first.shipped_code == first.code and first.stages[-1] == stage
    argv = ["coda-agent", "show", str(agent.run_dir), "--breakdown", "--format", "json"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as shown:
        main()
    assert not shown.value.code
    rows = {(r["stage"], r["part"]) for r in json.loads(capsys.readouterr().out)}
    assert {("tune_cpu", "(stage)"), ("tune_cpu", "search"), ("profile", "(stage)")} <= rows


# --- one run with the sm_90a compile stage on (the CPU default) --------------------------------


def test_agent_compile_stage_on_by_default(tmp_path):
    provider = MockProvider([CORRECT])
    cfg = AgentConfig.for_this_machine("mock/test", budgets=Budgets(rounds=1), seeds=(0,))
    assert cfg.plan.stages == ["correctness", "compile"]
    summary = run(Agent.create(TASK, provider, cfg, tmp_path))
    assert summary.status == "target_reached"
    verdict = RunReader(next(tmp_path.iterdir())).attempts()[0].verdict
    assert [(s.stage, s.outcome.value) for s in verdict.stages] == [
        ("static", "passed"), ("correctness", "passed"), ("compile", "passed"),
    ]
    assert "sm_90a build" in provider.calls[0].messages[1].content


def test_task_changed_since_the_run_started_refuses_to_resume(tmp_path):
    task_dir = tmp_path / "tasks"
    (task_dir / "human").mkdir(parents=True)
    for rel in ("gemm_residual_rmsnorm.yaml", "gemm_residual_rmsnorm.py", "human/gemm_residual_rmsnorm.py"):
        (task_dir / rel).write_text((TASK_DIR / rel).read_text())
    copy = find_task(str(task_dir / "gemm_residual_rmsnorm.yaml"))
    agent = Agent.create(copy, MockProvider([REFUSED]), config(rounds=1), tmp_path / "runs")
    run(agent)
    yaml_file = task_dir / "gemm_residual_rmsnorm.yaml"
    yaml_file.write_text(yaml_file.read_text().replace("version: 1", "version: 2"))
    with pytest.raises(TaskError, match="now version 2"):
        Agent.resume(agent.run_dir, MockProvider([REFUSED]))


@pytest.mark.gpu
def test_agent_on_the_gpu_times_candidates_against_the_human_kernel(tmp_path):
    """The real GPU stages: the human kernel is timed once, a correct candidate gets a timing record, and its
    schedule search runs on the run's executor (a short budget: the tuner's own GPU tests search for real; at
    the default 300 s this test ran past seven minutes)."""
    provider = MockProvider([REFUSED, CORRECT])
    cfg = AgentConfig.for_this_machine("mock/test", budgets=Budgets(rounds=2), target_speedup=0.8, seeds=(0,),
                                       tune_budget_s=20.0)
    assert cfg.plan.stages == ["gpu_correctness", "profile"] and cfg.plan.shape_set == "bench"
    agent = Agent.create(TASK, provider, cfg, tmp_path)
    summary = run(agent)
    reader = RunReader(agent.run_dir)
    assert set(reader.header.human_timing) == {p.name for p in TASK.shape("bench")}
    assert reader.header.device != "cpu"
    refused, correct = reader.attempts()
    assert refused.outcome == "static_rejected" and correct.passed, correct.verdict.reason
    assert "tune" in correct.durations and correct.durations["tune"] < 300
    assert set(correct.timing["shapes"]) == set(reader.header.human_timing)
    assert 0.5 < correct.timing["speedup_vs_human"] < 2 and 0 < correct.timing["sol_fraction"] <= 1.5
    assert summary.best_attempt == 2 and summary.speedup_vs_human == correct.timing["speedup_vs_human"]
    assert summary.status in ("target_reached", "completed")


def test_a_timed_run_tunes_on_its_executor_as_a_timed_job_and_a_failed_search_leaves_the_candidate(tmp_path):
    """No tune_fn given: the run's own tuner submits the tune stage to the run's executor (a timed job, its
    GPU to itself, with the run's budget); the search failing is a note, and the candidate stands as
    written."""
    plans = []
    gpu = fake_timing_backend()

    def verify_fn(task, source, plan):
        plans.append(plan)
        if plan.stages == ["tune"]:
            return Verdict(task=task.name, task_version=task.version, backend="quack",
                           outcome=Outcome.INFRA_ERROR, reason="no CUDA GPU on this machine")
        return gpu(task, source, plan)

    task = task_without_human_kernel(tmp_path / "mine")
    cfg = AgentConfig(model="mock/test", budgets=Budgets(rounds=1), tune_budget_s=12.0, plan=GPU_PLAN)
    agent = Agent.create(task, MockProvider([timed(1250)]), cfg, tmp_path / "runs", verify_fn=verify_fn)
    notes = []
    agent.events.note = notes.append
    run(agent)
    (attempt,) = RunReader(agent.run_dir).attempts()
    tuned = next(p for p in plans if p.stages == ["tune"])
    assert tuned.tune_budget_s == 12.0 and tuned.tune_cache and tuned.timed
    assert attempt.passed and attempt.tuning is None and attempt.shipped_code == attempt.code
    assert any(n.startswith("tuning failed: TuningFailed: no CUDA GPU") for n in notes)


# --- the CPU's target: correct, and near the speed of light by the cost estimate -----------------------


def estimated(fraction: float) -> str:
    """The correct reply, marked with the fraction of the speed of light the fake CPU estimate gives it."""
    return CORRECT.replace("def forward(", f"SOL_FRACTION = {fraction}\n\n\ndef forward(", 1)


def fake_cpu_verify(task, source, plan):
    """The CPU stages with the sm_90a build: every candidate passes, its cost estimate at each bench shape
    its ``SOL_FRACTION`` of the speed of light (100 µs)."""
    assert list(plan.stages) == ["correctness", "compile"]
    found = re.search(r"^SOL_FRACTION = ([0-9.]+)$", source, re.MULTILINE)
    fraction = float(found.group(1)) if found else 1.0
    cost = [{"shape": p.name, "sol_us": 100.0, "total_us": 100.0 / fraction} for p in task.shape("bench")]
    summary = f"Largest avoidable cost (at s): host ops' traffic, about {100 / fraction - 100:.0f} µs."
    return Verdict(task=task.name, task_version=task.version, backend="quack-compile", outcome=Outcome.PASSED,
                   stages=[StageResult(stage="static", outcome=Outcome.PASSED),
                           StageResult(stage="correctness", outcome=Outcome.PASSED),
                           StageResult(stage="compile", outcome=Outcome.PASSED,
                                       details={"cost": cost, "cost_summary": summary})])


def test_a_cpu_run_goes_on_until_a_correct_candidate_is_near_the_speed_of_light_by_the_estimate(tmp_path):
    """A manual seat's unfused kernel (a host multiply, 77% of SoL by the estimate) ended a CPU run as its
    first correct candidate, so the estimate the prompt promised never reached the model: the run goes on
    with it until a candidate reaches the target, which is then the best (ranked by the estimate)."""
    cfg = AgentConfig(model="mock/test", plan=Plan(stages=["correctness", "compile"]),
                      budgets=Budgets(rounds=5))
    provider = MockProvider([estimated(0.5), estimated(0.77), estimated(0.96), estimated(0.99)])
    agent = Agent.create(TASK, provider, cfg, tmp_path, verify_fn=fake_cpu_verify)
    summary = run(agent)
    reader = RunReader(agent.run_dir)
    assert reader.header.target == {"correct": True, "estimate_sol_fraction": 0.9}
    assert summary.status == "target_reached" and summary.best_attempt == 3
    # the fraction the run reached is kept and said where a timed run says its speed (a manual seat found
    # it only in the live log)
    assert summary.estimate_sol_fraction == pytest.approx(0.96) and summary.sol_fraction is None
    from coda_agent.cli.run_cmd import speed_text
    assert speed_text(summary) == "96% SoL by the CPU's cost estimate"
    assert [a.index for a in reader.attempts()] == [1, 2, 3]
    first, third = reader.attempts()[0], reader.attempts()[2]
    feedback = third.messages[-1].content  # after #2, at 77%
    assert ("A correct candidate exists, at 77% of the speed of light by the CPU's cost estimate; the target "
            "is 90%" in feedback and "speed is judged by the CPU's cost estimate" in feedback)
    assert "host ops' traffic, about 30 µs" in feedback
    assert "at least 90% of the speed of light" in first.messages[1].content
    # 0 (--target-estimate 0): the first correct candidate ends it, as before
    quick = AgentConfig(model="mock/test", plan=Plan(stages=["correctness", "compile"]), target_estimate=None)
    agent = Agent.create(TASK, MockProvider([estimated(0.5)]), quick, tmp_path / "q",
                         verify_fn=fake_cpu_verify)
    assert run(agent).best_attempt == 1 and RunReader(agent.run_dir).header.target == {"correct": True}


def test_among_untimed_correct_candidates_the_nearer_the_speed_of_light_by_the_estimate_is_best():
    from datetime import datetime, timezone

    from coda_agent.store.ranking import best_attempt, estimate_sol_fraction
    from coda_agent.store.records import Attempt

    now = datetime(2026, 12, 7, tzinfo=timezone.utc)

    def attempt(index: int, fraction: float | None) -> Attempt:
        v = fake_cpu_verify(TASK, estimated(fraction) if fraction else CORRECT,
                            Plan(stages=["correctness", "compile"]))
        if fraction is None:
            v.stages[-1].details = {}
        return Attempt(index=index, round=index, slot=0, started=now, finished=now,
                       messages=[ChatMessage(role="user", content="t")], raw_response="x", code="x",
                       verdict=v)

    unfused, fused, unpriced = attempt(1, 0.77), attempt(2, 0.98), attempt(3, None)
    assert estimate_sol_fraction(fused) == pytest.approx(0.98) and estimate_sol_fraction(unpriced) is None
    assert best_attempt([unfused, fused, unpriced]) is fused
    assert best_attempt([unpriced, unfused]) is unfused
