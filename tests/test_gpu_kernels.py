"""On the GPU (skipped without one): every human kernel passes ``gpu_correctness``, deliberately bad
candidates are rejected each with the right reason, and the profiler times a kernel with its baselines.

Candidates the static check would already refuse (a torch matmul, a side stream) are sent straight to the
checker's stages, so these tests prove the GPU-side detectors on their own.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from coda_agent.tasks import load_tasks
from coda_agent.tasks.model import Task
from coda_agent.verifier import Plan, sandbox, verify
from coda_agent.verifier import gpu as _gpu  # noqa: F401 - registers the GPU stages called directly below
from coda_agent.verifier.stages import STAGES, Context
from coda_agent.verifier.verdict import Outcome, StageResult, Verdict

from .conftest import REPO, TASK_DIR

pytestmark = pytest.mark.gpu

TASKS = {t.name: t for t in load_tasks([TASK_DIR]) if t.human_file is not None}
K0 = TASKS["gemm_residual_rmsnorm"]
K0_SHAPE = "llama3-1b-down"
K0_PLAN = Plan(stages=["gpu_correctness"], backend="quack", shape_set="bench", shape_names=[K0_SHAPE])
CANDIDATES = REPO / "tests" / "candidates"


def smallest_bench_shape(task: Task) -> str:
    return min(task.shape("bench"), key=lambda p: task.flops(p.dims)).name


def unchecked(task: Task, source: str, stage: str, shape: str) -> StageResult:
    """One stage of the checker *without* the static check in front (what verify() adds)."""
    plan = Plan(stages=[stage], backend="quack", shape_set="bench", shape_names=[shape], timeout=900)
    return STAGES[stage](Context(task=task, source=source, plan=plan, deadline=time.monotonic() + 900))


@pytest.fixture(scope="module")
def human_verdicts() -> dict[str, Verdict]:
    """Every human kernel through verify() at its smallest bench shape, four workers at a time."""

    def one(task: Task) -> Verdict:
        plan = Plan(stages=["gpu_correctness"], backend="quack", shape_set="bench",
                    shape_names=[smallest_bench_shape(task)], timeout=900)
        return verify(task, task.human_file.read_text(), plan)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(TASKS, pool.map(one, TASKS.values()), strict=True))


@pytest.mark.parametrize("name", sorted(TASKS))
def test_human_kernel_passes_gpu_correctness(name, human_verdicts):
    v = human_verdicts[name]
    assert v.outcome is Outcome.PASSED, v.reason
    st = v.stage("gpu_correctness")
    (shape,) = st.details["shapes"].values()
    launches = shape["launches"]
    assert shape["outcome"] == "passed" and 1 <= launches["launches"] <= TASKS[name].launch_budget
    assert launches["quack_kernels"] >= 1
    assert launches["launches_estimate"] == launches["launches"], launches  # the CPU's estimate is exact
    # three seeds, and the stress set's where the task draws one (its check carries the set's own seed)
    assert {c.seed for c in st.checks if not c.stress} == {0, 1, 2} and all(c.ok for c in st.checks)
    assert any(c.stress for c in st.checks) == bool(TASKS[name].stress_inits())


def _candidate(name: str) -> str:
    return (CANDIDATES / name).read_text()


def test_torch_matmul_fallback_is_rejected_by_the_trace():
    v = unchecked(K0, _candidate("k0_torch_matmul.py"), "gpu_correctness", K0_SHAPE)
    assert v.outcome is Outcome.CHEAT_DETECTED, v.reason
    assert "cuBLAS/torch matmul kernel" in v.reason


def test_matmul_through_torch_linalg_is_rejected_by_both_layers():
    """The static check refuses torch.linalg; were it to miss it, the kernel trace still catches cuBLAS."""
    source = _candidate("k0_linalg_matmul.py")
    v = verify(K0, source, K0_PLAN)
    assert v.outcome is Outcome.STATIC_REJECTED and "torch.linalg is not allowed" in v.reason
    v = unchecked(K0, source, "gpu_correctness", K0_SHAPE)
    assert v.outcome is Outcome.CHEAT_DETECTED and "cuBLAS/torch matmul kernel" in v.reason


def test_partial_write_is_rejected():
    v = verify(K0, _candidate("k0_partial_write.py"), K0_PLAN)
    assert v.outcome is Outcome.WRONG_OUTPUT, v.reason


def test_input_mutation_is_rejected():
    v = verify(K0, _candidate("k0_mutates_input.py"), K0_PLAN)
    assert v.outcome is Outcome.CHEAT_DETECTED and "modified its inputs ['residual']" in v.reason


@pytest.mark.parametrize("name", ["k0_cached.py", "k0_cached_copy.py"])
def test_answers_cached_across_calls_are_rejected_by_both_layers(name):
    v = verify(K0, _candidate(name), K0_PLAN)
    assert v.outcome is Outcome.STATIC_REJECTED and "module-level 'CACHE'" in v.reason
    v = unchecked(K0, _candidate(name), "gpu_correctness", K0_SHAPE)
    assert v.outcome is Outcome.RUNTIME_ERROR and "item assignment" in v.reason


def test_side_stream_work_is_rejected():
    v = unchecked(K0, _candidate("k0_side_stream.py"), "gpu_correctness", K0_SHAPE)
    assert v.outcome is Outcome.CHEAT_DETECTED, v.reason
    assert "side stream" in v.reason


def test_profile_times_the_kernel_with_eager_compile_and_cublas():
    timed = K0_PLAN.model_copy(update={"stages": ["gpu_correctness", "profile"]})
    v = verify(K0, K0.human_file.read_text(), timed)
    assert v.outcome is Outcome.PASSED, v.reason
    shape = v.stage("profile").timings[K0_SHAPE]
    for t in (shape.candidate, shape.eager, shape.compiled, shape.cublas):
        assert t is not None and t.reps >= 15 and t.p10_us <= t.median_us <= t.p90_us
    # the fused kernel is within a reasonable band of cuBLAS alone (a gross regression would fail here)
    assert shape.cublas.median_us / shape.candidate.median_us > 0.7
    # honest kernels are timed by their events: the wall clock agrees with them
    # events and wall medians in the message
    assert shape.candidate.bound == "events" and shape.cublas.bound == "events", shape


@pytest.mark.skipif(not sandbox.detect().isolated,
                    reason="no bubblewrap here: the runner is a plain process (the CPU twin skips too)")
def test_code_past_the_static_check_reaches_nothing_from_the_gpu_runner(escape_bait):
    """The GPU runner (device nodes bound in) is as contained as the CPU one: no secret, network or host
    file."""
    v = unchecked(K0, escape_bait.source, "gpu_correctness", K0_SHAPE)
    assert not escape_bait.reached(), "the candidate reached a loopback listener"
    assert escape_bait.key not in v.model_dump_json() and escape_bait.sentinel.read_text() == "original"
    assert v.outcome is Outcome.PASSED, v.reason
