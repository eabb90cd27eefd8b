"""Every human kernel is the ground truth: it must pass the emulator check and compile for sm_90a."""

from __future__ import annotations

import pytest

from coda_agent.tasks import load_tasks
from coda_agent.verifier import Plan, verify
from coda_agent.verifier.verdict import Outcome

from .conftest import TASK_DIR

TASKS = load_tasks([TASK_DIR])


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS, ids=[t.name for t in TASKS])
def test_human_kernel_passes_emulator_and_compiles_for_sm90(task):
    assert task.human_file is not None, f"{task.name} has no human kernel"
    verdict = verify(task, task.human_file.read_text(), Plan(stages=("correctness", "compile"), timeout=900))
    assert verdict.outcome is Outcome.PASSED, verdict.reason
    names = [s.stage for s in verdict.stages]
    assert names == ["static", "correctness", "compile"]
    checks = verdict.stage("correctness").checks
    assert {c.output for c in checks} == {o.name for o in task.outputs}
    assert all(c.ok for c in checks)


def test_suite_covers_the_three_families():
    assert len(TASKS) >= 12
    assert {t.family for t in TASKS} == {"forward", "backward", "block"}
