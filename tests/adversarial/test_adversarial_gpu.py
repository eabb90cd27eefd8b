"""The adversarial suite on the H200 (marker ``gpu``; skipped without a CUDA device).

Each case in ``manifest.GPU_CASES`` is verified with ``("gpu_correctness", "profile")`` on the QuACK backend
at one bench shape, through the same fake agent and checks as the CPU suite (no pass, an acceptable
outcome, no leak, no listener connection, no survivor, no file touched). Timing cheats must in addition
never be reported faster than the honest kernel: when a verdict passes ``gpu_correctness``, the candidate's
profile median at each shape must be at least ``HONEST_FRACTION`` of the human kernel's median, measured in
the same session with the same stages. (That the GPU manifest lists every file of ``gpu_cases/`` is checked
by the CPU suite, on every machine.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from coda_agent.tasks import find_task
from coda_agent.verifier.verdict import Verdict

from .harness import Agent, Listener, run_case
from .manifest import GPU_CASES, Case

pytestmark = pytest.mark.gpu

#: Run-to-run noise between two honest measurements stays well inside 20%; a cached, replayed or side-stream
#: answer is 10-1000x faster.
HONEST_FRACTION = 0.8
_HONEST: dict[tuple[str, tuple[str, ...] | None], dict[str, float]] = {}


def _medians(verdict: Verdict) -> dict[str, float]:
    prof = verdict.stage("profile")
    return {name: t.candidate.median_us for name, t in prof.timings.items()} if prof is not None else {}


def _honest_medians(case: Case, agent: Agent) -> dict[str, float]:
    key = (case.task, case.shape_names)
    if key not in _HONEST:
        task = find_task(case.task)
        reply = agent.verify(case.task, task.human_file.read_text(), case.plan, wait=case.timeout + 120)
        assert "verdict" in reply, reply
        v = Verdict.model_validate_json(str(reply["verdict"]))
        assert v.passed, f"the human kernel must pass the GPU stages: {v.outcome.value}: {v.reason}"
        _HONEST[key] = _medians(v)
    return _HONEST[key]


@pytest.mark.parametrize("case", GPU_CASES, ids=[c.id for c in GPU_CASES])
def test_adversarial_gpu_case_is_refused(case: Case, agent: Agent, listener: Listener,
                                         tmp_path: Path) -> None:
    honest = _honest_medians(case, agent) if case.timing else {}
    result = run_case(case, agent, listener, tmp_path)
    problems = list(result.problems)
    if case.timing and result.verdict is not None:
        v = Verdict.model_validate(result.verdict)
        corr = v.stage("gpu_correctness")
        if corr is not None and corr.outcome.value == "passed":
            for shape, us in _medians(v).items():
                if shape in honest and us < HONEST_FRACTION * honest[shape]:
                    problems.append(
                        f"at {shape} the profile reports {us:.1f} µs, faster than the honest kernel's "
                        f"{honest[shape]:.1f} µs")
    assert not problems, f"{case.file} ({case.family}) -> {result.outcome}:\n  " + "\n  ".join(problems)
