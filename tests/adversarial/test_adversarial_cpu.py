"""The adversarial suite on the CPU stages: every case in ``manifest.CPU_CASES`` must be refused with an
acceptable outcome and a reason, leak no planted secret, reach no listener, leave no process and touch no
file.

Negative control: every human kernel passes through the very same driver (no false rejections).

``verify()`` runs inside a fake agent process that holds fake API keys in its initial environment, as the
real ``coda-agent run`` does (see ``agent_proc.py``). With ``CODA_ADV_REPORT=path`` set, one JSON line per
case is appended to that file (outcome, reason, problems), for a summary of the holes.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ..conftest import REPO, TASK_DIR
from .harness import Agent, Listener, run_case
from .manifest import CPU_CASES, GPU_CASE_DIR, GPU_CASES, Case

HUMANS = sorted((TASK_DIR / "human").glob("*.py"))


@pytest.mark.parametrize("case", CPU_CASES, ids=[c.id for c in CPU_CASES])
@pytest.mark.slow
def test_adversarial_case_is_refused(case: Case, agent: Agent, listener: Listener, tmp_path: Path) -> None:
    result = run_case(case, agent, listener, tmp_path)
    assert not result.problems, (f"{case.file} ({case.family}) -> {result.outcome}:\n  "
                                 + "\n  ".join(result.problems))


@pytest.mark.parametrize("human", HUMANS, ids=[p.stem for p in HUMANS])
def test_human_kernel_passes_through_the_same_driver(human: Path, agent: Agent, listener: Listener,
                                                     tmp_path: Path) -> None:
    """No false rejections: the same agent, stages and side checks, and the verdict must be PASSED."""
    case = Case(human.name, "control", frozenset({"passed"}), task=human.stem, timeout=60.0, control=True)
    result = run_case(case, agent, listener, tmp_path, source=human.read_text())
    assert not result.problems, f"{human.name} -> {result.outcome}:\n  " + "\n  ".join(result.problems)


def test_manifest_covers_every_case_file_once() -> None:
    files = sorted(p.name for p in (REPO / "tests" / "adversarial" / "cases").glob("*.py"))
    listed = sorted(c.file for c in CPU_CASES)
    assert listed == files
    for c in CPU_CASES:
        assert "passed" not in c.accept
        assert c.path.read_text().startswith('"""'), f"{c.file} must start with its docstring"
        assert "Family:" in c.path.read_text(), c.file


def test_gpu_manifest_covers_every_gpu_case_file_once() -> None:
    """Checked on every machine, so that a GPU case cannot silently drop out of the manifest."""
    assert sorted(c.file for c in GPU_CASES) == sorted(p.name for p in GPU_CASE_DIR.glob("*.py"))
    for c in GPU_CASES:
        assert "passed" not in c.accept and c.path.exists() and "Family:" in c.path.read_text(), c.file


def test_cases_are_real_candidates() -> None:
    """Each case parses and defines a top-level forward() (a syntax error would be a strawman, not a
    cheat)."""
    for c in [*CPU_CASES, *GPU_CASES]:
        tree = ast.parse(c.path.read_text(), filename=c.file)
        assert any(isinstance(n, ast.FunctionDef) and n.name == "forward" for n in tree.body), c.file
