"""Synthetic run records and bench results, written with the real schema models (records.py, results.py)."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from coda_agent.bench.results import BenchRow, BenchRun
from coda_agent.measure.timing import Timing
from coda_agent.messages import ChatMessage
from coda_agent.store.records import Attempt, RunHeader, RunSummary, Usage, write_json_atomic
from coda_agent.verifier.verdict import Outcome, OutputCheck, StageResult, Verdict

T0 = datetime(2026, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
H200 = "NVIDIA H200"

GOOD_CODE = '''"""RMSNorm epilogue on the GEMM accumulator."""
from coda_agent.primitives import gemm, epilogue


def forward(x, w, gamma):
    return gemm(x, w, epilogue=epilogue.rmsnorm(gamma, eps=1e-6))
'''
BAD_CODE = GOOD_CODE.replace("eps=1e-6", "eps=1e-2")

REASONS = {
    "wrong_output": "output y: max |err| 3.1e-01 > allowed 2.0e-02 at [3, 17] (shape small, seed 1)",
    "compile_error": "SyntaxError: invalid syntax (candidate.py, line 4)",
    "static_rejected": "line 2: import of 'os' is not allowed",
    "runtime_error": "forward() raised ValueError: epilogue rmsnorm needs gamma of shape [N]",
}

#: Where a synthetic correctness stage's 2.5 s went (0.3 s in no part: 'other').
CORRECTNESS_PARTS = {"runner start": 0.6, "reference FP32": 0.9, "candidate": 0.4, "checks": 0.3}



def verdict(outcome: str, task: str, version: int) -> Verdict:
    o = Outcome(outcome)
    ok = o is Outcome.PASSED
    checks = [
        OutputCheck(output="y", shape_point="small", seed=0, ok=ok, max_abs_err=0.004 if ok else 0.31,
                    allowed=0.02, lowp_err=0.01, worst_index=[3, 17]),
    ]
    stages = [StageResult(stage="static", outcome=Outcome.PASSED, seconds=0.01)]
    if o is not Outcome.STATIC_REJECTED:
        ran = o in (Outcome.PASSED, Outcome.WRONG_OUTPUT)
        stages.append(StageResult(stage="correctness", outcome=o, reason=REASONS.get(outcome, ""),
                                  seconds=2.5, checks=checks if ran else [],
                                  seconds_by_part=CORRECTNESS_PARTS if ran else {}))
    else:
        stages[0] = StageResult(stage="static", outcome=o, reason=REASONS[outcome], seconds=0.01)
    return Verdict(task=task, task_version=version, backend="torch", outcome=o,
                   reason="" if ok else REASONS.get(outcome, outcome), stages=stages)


def make_run(
    runs_dir: Path,
    *,
    task: str = "gemm_rmsnorm",
    version: int = 1,
    model: str = "anthropic/claude-sonnet-4-5",
    device: str = H200,
    outcomes: tuple[str, ...] = ("wrong_output", "passed"),
    times: dict[str, float] | None = None,
    session: dict[str, dict[str, float]] | None = None,
    created: datetime = T0,
    run_id: str | None = None,
    cost: float = 0.05,
    tokens: tuple[int, int] = (3000, 800),
    summary: bool = True,
    params: dict[str, Any] | None = None,
    stages: list[str] | None = None,
    code: str = GOOD_CODE,
    priced: bool = True,
    task_hash: str | None = None,
    task_path: str | None = None,
) -> Path:
    """A finished run: one attempt per outcome (one per round); passing attempts timed at ``times`` (shape ->
    µs).

    ``priced=False``: a model missing from the price table (cost 0, unknown), as summaries used to record it.

    ``session`` adds what the agent's profile stage records next to a candidate (shape -> human_us,
    eager, compiled, cublas, sol_us), and the header's ``human_timing``.
    """
    run_id = (run_id
              or hashlib.sha1(repr((task, version, model, device, created, outcomes,
                                    task_hash)).encode()).hexdigest()[:8])
    d = runs_dir / f"{created:%Y%m%d-%H%M%S}_{task}_{run_id}"
    header = RunHeader(
        run_id=run_id, created=created, task=task, task_version=version,
        task_path=task_path or f"tasks/{task}.yaml", task_hash=task_hash, model=model,
        params=params if params is not None else {"temperature": 0.2}, device=device, host="box1",
        verifier_stages=stages if stages is not None else ["static", "correctness"], git_commit="abc1234def",
    )
    data = header.model_dump(mode="json")
    if session:  # what the agent records next to its own candidates, in the header as well
        data["human_timing"] = {s: v["human_us"] for s, v in session.items() if "human_us" in v}
    write_json_atomic(d / "header.json", data)
    t = created
    first_correct = None
    best: tuple[float, int] | None = None
    for i, outcome in enumerate(outcomes, start=1):
        passed = outcome == "passed"
        timing: dict[str, Any] = {}
        if passed and times:
            shapes: dict[str, Any] = {}
            for s, us in times.items():
                entry: dict[str, Any] = {"median_us": us}
                extra = (session or {}).get(s, {})
                if "human_us" in extra:
                    entry["human_us"] = extra["human_us"]
                if "sol_us" in extra:
                    entry["sol_us"] = extra["sol_us"]
                base = {k: extra[k] for k in ("eager", "compiled", "cublas") if k in extra}
                if base:
                    entry["baselines"] = base
                shapes[s] = entry
            timing = {"shapes": shapes, "geomean_us": min(times.values())}
        a = Attempt(
            index=i, round=i, slot=0, started=t, finished=t + timedelta(seconds=20),
            messages=[ChatMessage(role="system", content="You write kernels with the primitive API."),
                      ChatMessage(role="user", content=f"Task {task}: fuse RMSNorm into the GEMM epilogue.")],
            raw_response=f"```python\n{code if passed else BAD_CODE}```",
            code=None if outcome == "no_code" else (code if passed else BAD_CODE),
            extraction_error="no code block in the reply" if outcome == "no_code" else None,
            verdict=None if outcome == "no_code" else verdict(outcome, task, version),
            usage=Usage(input_tokens=tokens[0], output_tokens=tokens[1], cost_usd=cost if priced else 0.0,
                        price_known=priced),
            durations={"llm": 15.0, "verify": 5.0}, timing=timing,
        )
        write_json_atomic(d / "attempts" / f"{i:04d}.json", a)
        t += timedelta(seconds=30)
        if passed:
            first_correct = first_correct or (i, (a.finished - created).total_seconds())
            if best is None or (times and min(times.values()) < best[0]):
                best = (min(times.values()) if times else 0.0, i)
    if summary:
        n = len(outcomes)
        s = RunSummary(
            status="target_reached" if first_correct else "budget_exhausted", rounds=n, attempts=n,
            passes=sum(o == "passed" for o in outcomes), best_attempt=best[1] if best else None,
            best_time_us=best[0] if best and times else None, input_tokens=tokens[0] * n,
            output_tokens=tokens[1] * n, cost_usd=cost * n if priced else 0.0, wall_seconds=30.0 * n,
            seconds_to_first_correct=first_correct[1] if first_correct else None, updated=t,
        )
        write_json_atomic(d / "summary.json", s)
    if best:
        (d / "best.py").write_text(code)
    return d


def bench_row(task: str, shape: str, human: float | None, *, version: int = 1, eager: float = 200.0,
              compiled: float = 150.0, cublas: float = 95.0, sol: float = 80.0, correct: bool = True,
              author: str = "human", task_hash: str | None = None) -> BenchRow:
    t = lambda us: Timing(median_us=us, p10_us=us * 0.98, p90_us=us * 1.02, reps=100)  # noqa: E731
    return BenchRow(
        task=task, task_version=version, task_hash=task_hash, shape=shape,
        dims={"M": 4096, "N": 4096, "K": 4096}, author=author, correct=correct,
        verdict_reason="" if correct else "output y outside tolerance",
        candidate=t(human) if human is not None else None, eager=t(eager), compiled=t(compiled),
        cublas=t(cublas), sol_us=sol, flops=1.4e11, min_bytes=1e8, launches=1,
    )


def make_bench(bench_dir: Path, rows: list[BenchRow], *, device: str = H200, created: datetime = T0,
               name: str | None = None) -> Path:
    run = BenchRun(created=created, command="coda-agent bench", device=device, driver="570.1", rows=rows,
                   timing_method="cuda-graph replay, L2 flushed")
    path = bench_dir / (name or f"h200-{created:%Y%m%d-%H%M%S}.json")
    write_json_atomic(path, run)
    return path
