"""The CPU's cost estimate (verifier.cost): the bytes, launches and host ops of a candidate at a bench shape,
priced on the roofline, recorded by the compile stage and shown in the feedback with what a faster candidate
would cut."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
import torch

from coda_agent.measure.peaks import NOMINAL_H200, Peaks
from coda_agent.messages import ChatMessage
from coda_agent.primitives import backend
from coda_agent.prompts.feedback import feedback_prompt
from coda_agent.runner.serve import OpLog
from coda_agent.store.records import Attempt
from coda_agent.tasks import find_task, load_tasks
from coda_agent.tasks.loader import import_file
from coda_agent.tasks.model import torch_dtype
from coda_agent.verifier import cost
from coda_agent.verifier.stages import cost_details
from coda_agent.verifier.verdict import Outcome, StageResult, Verdict

#: Round peaks, so the expected times are easy to write down: 1 PFLOP/s, 4 TB/s.
PEAKS = Peaks(tflops_bf16=1000.0, hbm_tbps=4.0, how="test", measured=False)


def op_log(task_name: str, dims: dict[str, int], source: str | None = None, tmp_path=None) -> list[dict]:
    """forward() of a task's human kernel (or ``source``) on meta tensors at ``dims``, under the runner's op
    log."""
    task = find_task(task_name)
    path = task.human_file
    if source is not None:
        path = tmp_path / "candidate.py"
        path.write_text(source)
    module = import_file(path, f"cost_test_{task_name}_{source is not None}")
    meta = {
        s.name: torch.empty(s.concrete_shape(dims), dtype=torch_dtype(s.dtype), device="meta")
        for s in task.inputs}
    log = OpLog()
    with torch.no_grad(), backend.using("shapes", wrap=log.wrap_backend), log, log.call():
        module.forward(**meta, **task.constants)
    return log.calls[0]


def test_the_estimate_of_the_swiglu_kernel_counts_each_tensor_once():
    """gemm_swiglu at M 8192, F 14336, K 4096: x and w read, preact (M, 2F) stored as D, act (M, F) as an
    extra output; one launch; compute-bound."""
    m, f, k = 8192, 14336, 4096
    ops = op_log("gemm_swiglu", {"M": m, "F": f, "K": k})
    est = cost.estimate(ops, PEAKS, shape="llama3-8b-gateup")
    b = est.bytes_by_kind
    assert (b["A"], b["B"], b["D"], b["outputs"]) == (m * k * 2, 2 * f * k * 2, m * 2 * f * 2, m * f * 2)
    assert b["C"] == b["tiles"] == b["vectors"] == b["reduces"] == 0
    assert est.launches == 1 and est.host_ops == [] and est.launch_us == est.host_us == 0
    assert est.flops == 2 * m * 2 * f * k
    assert est.compute_us == pytest.approx(est.flops / 1e15 * 1e6)  # FLOPs at 1 PFLOP/s, in µs
    assert est.memory_us == pytest.approx(sum(b.values()) / 4e12 * 1e6)
    assert (est.total_us == pytest.approx(max(est.compute_us, est.memory_us))
            and est.compute_us > est.memory_us)
    assert est.epilogue_bytes == m * 2 * f * 2 + m * f * 2
    assert "nothing avoidable" in est.dominant()


def test_launches_count_each_sinks_finalisation_and_each_host_op():
    """gemm_rmsnorm_cross_entropy's kernel: OnlineLSEReduce's finalisation is 9 launches, and the estimate
    counts what the launch rule counts (verifier.trace.LaunchEstimate)."""
    from coda_agent.verifier.trace import LaunchEstimate

    task = find_task("gemm_rmsnorm_cross_entropy")
    dims = dict(task.shape("bench")[0].dims)
    ops = op_log(task.name, dims)
    est = cost.estimate(ops, PEAKS)
    assert est.launches == LaunchEstimate.from_ops(ops).launches
    assert est.launch_us == pytest.approx((est.launches - est.gemms - est.host_launches) * cost.LAUNCH_US)


def test_a_host_op_that_launches_several_kernels_counts_them_all():
    """torch.logsumexp is one op in the log and nine kernels on a GPU (a manual-seat model's kernel passed the
    CPU's budget with one and would have been over it on the GPU); the estimate and the rule agree."""
    from coda_agent.verifier.trace import LaunchEstimate

    ops = [{"gemm": [64, 128, 32], "sinks": ["ColVecReduce"]},
           {"op": "aten::logsumexp", "numel": 64 * 128, "bytes": 64 * 128 * 2},
           {"op": "aten::sub.Tensor", "numel": 64, "bytes": 3 * 64 * 4},
           {"op": "aten::empty.memory_format", "numel": 64}]
    rule = LaunchEstimate.from_ops(ops)
    assert (rule.launches, rule.gemm_launches, rule.host_launches) == (12, 2, 10)
    assert rule.host_ops == ["aten::logsumexp", "aten::sub.Tensor"]
    est = cost.estimate(ops, PEAKS)
    assert (est.launches, est.host_launches) == (12, 10)
    assert est.launch_us == pytest.approx(1 * cost.LAUNCH_US)  # the finalisation
    # the counts the host-ops probe measured on an H100: a top-k is two kernels, a sort three, a pad two
    measured = [{"op": "aten::topk", "numel": 64}, {"op": "aten::sort", "numel": 64},
                {"op": "aten::constant_pad_nd", "numel": 64}]
    assert LaunchEstimate.from_ops(measured).host_launches == 7


def test_the_largest_avoidable_cost_is_named():
    """A memory-bound call that also stores an extra full tile: the bytes above the task's minimum dominate,
    and the extra outputs are named; with host ops on large tensors besides, their launches and traffic count
    too."""
    m, n, k = 8192, 8192, 64
    bytes_ = {"A": m * k * 2, "B": k * n * 2, "C": 0, "tiles": 0, "vectors": 0, "D": m * n * 2,
              "outputs": 2 * m * n * 2, "reduces": 0}
    gemm_op = {"gemm": [m, n, k], "sinks": [], "config": None, "bytes": bytes_}
    est = cost.estimate([gemm_op], PEAKS, shape="s", min_bytes=bytes_["A"] + bytes_["B"] + bytes_["D"])
    assert est.memory_us > est.compute_us
    assert "HBM bytes above the task's minimum" in est.dominant() and "extra outputs stored" in est.dominant()
    hosty = cost.estimate([gemm_op, *({"op": "aten::add.Tensor", "numel": 64} for _ in range(40))], PEAKS,
                          shape="s", min_bytes=sum(bytes_.values()))
    assert hosty.launches == 41 and "40 launch(es) besides the GEMM kernels" in hosty.dominant()


def test_a_product_computed_twice_is_the_largest_avoidable_cost():
    """A manual-seat kernel ran its one listed GEMM twice (a pass for the row statistic, then the same GEMM
    to apply it): it passes, and the estimate named 3 launches (9 µs) as the largest avoidable cost where the
    second GEMM costs about half of it."""
    m, n, k = 8192, 2304, 9216
    bytes_ = {"A": m * k * 2, "B": k * n * 2, "D": m * n * 2}
    twice = [{"gemm": [m, n, k], "sinks": ["ColVecReduce"], "bytes": bytes_},
             {"op": "aten::rsqrt", "numel": m, "bytes": 2 * m * 4},
             {"gemm": [m, n, k], "sinks": [], "bytes": bytes_}]
    est = cost.estimate(twice, PEAKS, shape="s", task_flops=2.0 * m * n * k)
    assert est.dominant().startswith("GEMM work above the task's listed GEMMs (2.00x their FLOPs in 2 gemm "
                                     "calls: a product computed more than once")
    assert f"about {est.gemm_us / 2:.0f} µs of the" in est.dominant()
    once = cost.estimate(twice[:1], PEAKS, shape="s", task_flops=2.0 * m * n * k)
    assert "GEMM work" not in once.dominant()


@pytest.mark.parametrize("task", load_tasks(), ids=lambda t: t.name)
def test_no_human_kernel_does_gemm_work_beyond_its_tasks_listed_gemms(task):
    """The surplus the estimate names is measured against the task's ``gemms``: every human kernel's gemm
    calls add up to them at every bench shape (the block's two GEMMs, the heads' chunks)."""
    for p in task.shape("bench"):
        details = cost_details(task, {p.name: op_log(task.name, dict(p.dims))})
        (c,) = details["cost"]
        listed = sum(2.0 * m * n * k for m, n, k in task.gemm_shapes(p.dims))
        assert c["task_flops"] == listed and c["flops"] <= cost.FLOPS_SLACK * listed, p.name


def test_a_host_ops_traffic_is_the_bytes_its_tensors_hold():
    """A bf16 column sum into FP32 reads its input once: 2 bytes an element, not the largest tensor at 4 bytes
    read and written (which the manual seat saw quadruple it)."""
    from coda_agent.runner.serve import OpLog

    x = torch.empty(8192, 4096, dtype=torch.bfloat16, device="meta")
    log = OpLog()
    with log, log.call():
        x.sum(0, dtype=torch.float32)
    (op,) = log.calls[0]
    assert op["op"].startswith("aten::sum") and op["bytes"] == 8192 * 4096 * 2 + 4096 * 4
    est = cost.estimate([op], PEAKS, shape="s")
    assert est.host_bytes == op["bytes"]
    legacy = cost.estimate([{"op": op["op"], "numel": op["numel"]}], PEAKS, shape="s")
    assert legacy.host_bytes == 2 * 4 * 8192 * 4096  # a record without bytes keeps the old rule


def test_the_compile_stage_records_the_estimate_at_each_bench_shape():
    task = find_task("gemm_swiglu")
    seen = {p.name: op_log(task.name, dict(p.dims)) for p in task.shape("bench")}
    details = cost_details(task, seen)
    assert [c["shape"] for c in details["cost"]] == [p.name for p in task.shape("bench")]
    assert all(c["launches"] == 1 and c["sol_us"] > 0 for c in details["cost"])
    summary = str(details["cost_summary"])
    assert ("| llama3-8b-gateup |" in summary and "Largest avoidable cost" in summary
            and cost.HOW_WELL in summary)


def test_feedback_shows_the_estimate_and_steers_a_cpu_run_toward_what_to_cut(tmp_path):
    task = find_task("gemm_swiglu")
    seen = {p.name: op_log(task.name, dict(p.dims)) for p in task.shape("bench")}
    details = cost_details(task, seen)
    v = Verdict(task=task.name, task_version=1, backend="torch", outcome=Outcome.PASSED, reason="", stages=[
        StageResult(stage="static", outcome=Outcome.PASSED),
        StageResult(stage="compile", outcome=Outcome.PASSED, details=details),
    ])
    now = datetime(2026, 12, 3, tzinfo=timezone.utc)
    code = task.human_file.read_text()
    a = Attempt(index=1, round=1, slot=0, started=now, finished=now,
                messages=[ChatMessage(role="user", content="t")], raw_response=f"```python\n{code}\n```",
                code=code, verdict=v)
    text = feedback_prompt([a], population=[a], goal_is_speed=False)
    assert "Cost estimate on the CPU" in text and "| llama3-8b-gateup |" in text
    assert "speed is judged by the CPU's cost estimate" in text and "Largest avoidable cost" in text


def test_every_gemm_record_carries_its_bytes():
    """The op log's gemm records hold GemmCall.hbm_bytes: what the estimate prices (C and vectors
    included)."""
    task = find_task("gemm_residual_rmsnorm")
    dims = dict(task.shape("bench")[0].dims)
    gemm_ops = [op for op in op_log(task.name, dims) if "gemm" in op]
    assert (gemm_ops
            and all(set(op["bytes"]) == {"A", "B", "C", "tiles", "vectors", "D", "outputs", "reduces",
                                         "copies"}
                    for op in gemm_ops))
    assert any(op["bytes"]["C"] > 0 or op["bytes"]["tiles"] > 0 for op in gemm_ops)  # the residual is read
    assert NOMINAL_H200.hbm_tbps > 0


def test_a_reshape_that_copies_is_one_launch_its_unmarked_view_none():
    """``expand(...).reshape(-1)`` copies (a clone) and hands the copy to ``aten::_unsafe_view``, whose
    schema says nothing of aliasing: the log counted it a kernel, refusing a QK-norm kernel of four launches
    as five (a manual seat)."""
    from coda_agent.runner.serve import OpLog

    g = torch.empty(128, dtype=torch.bfloat16, device="meta")
    log = OpLog()
    with log, log.call():
        g.expand(4, 128).reshape(-1)
    assert [op["op"].split(".")[0] for op in log.calls[0]] == ["aten::clone"]


def test_a_pinned_tile_of_64x64_or_less_gets_a_note_the_estimate_does_not_price_it():
    """A 64x16 tile read 100% of the speed of light by the estimate (a manual seat): the estimate leaves the
    config out, and says so where the config is one the H200 measured far slower."""
    gemm = {"gemm": [8192, 8192, 2048], "bytes": {"A": 1, "B": 1, "D": 1}}
    small = cost.estimate([{**gemm, "config": {"tile_m": 64, "tile_n": 16}}], PEAKS, shape="s")
    assert small.notes and "pins a 64x16 tile, which this estimate does not price" in small.notes[0]
    assert "Note: a gemm call pins a 64x16 tile" in cost.summary([small])
    for config in ({"tile_m": 128, "tile_n": 64}, {}, None):
        assert cost.estimate([{**gemm, "config": config}], PEAKS, shape="s").notes == []


BROADCAST_TILE = """
from coda_agent.primitives import epilogue, gemm


@epilogue()
def add(acc, t):
    return {"D": acc + t}


def forward(x, w, residual):
    return {"out": gemm(add, x, w.t(), t=residual[:1].expand(residual.shape[0], -1))["D"]}
"""


def test_the_backends_copy_of_a_strided_tile_operand_is_priced_by_its_bytes(tmp_path):
    """A broadcast (M, N) tile operand is copied to contiguous memory before the launch: one launch, which
    the estimate charged, and M x N elements written, which it did not (a manual seat's copy of 67 MB cost
    3 µs)."""
    dims = {"M": 8192, "N": 4096, "K": 4096}
    (op,) = [o for o in op_log("gemm_residual", dims, BROADCAST_TILE, tmp_path) if "gemm" in o]
    size = 8192 * 4096 * 2
    assert op["bytes"]["copies"] == 2 * size and op["bytes"]["tiles"] == size
    est = cost.estimate([op], PEAKS, shape="s")
    assert est.bytes_by_kind["copies"] == 2 * size and est.epilogue_bytes >= 3 * size
    plain = [o for o in op_log("gemm_residual", dims) if "gemm" in o]
    assert all(o["bytes"]["copies"] == 0 for o in plain)
