"""The checker's memory is bounded and known: chunked comparisons give the whole-tensor verdicts, the estimate
of a verification's peak, and the one-line refusal of a task that cannot fit the device."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from coda_agent.tasks import find_task
from coda_agent.tasks.footprint import reference_working_bytes
from coda_agent.tasks.model import Init, ShapePoint, Task, torch_dtype
from coda_agent.verifier import compare
from coda_agent.verifier.compare import BASELINE_TEXT, check_outputs, chunk_spans, max_abs_difference
from coda_agent.verifier.plan import (
    CHUNK_BUFFERS,
    CHUNK_ELEMENTS,
    TIMING_SETS,
    Plan,
    memory_need,
    memory_refusal,
)
from coda_agent.verifier.verdict import OutputCheck, StageMemory, StageResult, Verdict

from .conftest import cli

GiB = 1 << 30


# --- the comparison as it was: whole tensors in FP64 (the rule the chunked one must reproduce exactly) ------


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for d in reversed(shape):
        out.append(flat % d if d else 0)
        flat = flat // d if d else 0
    return list(reversed(out))


def whole_tensor_check(task: Task, name: str, got: torch.Tensor, ref32: torch.Tensor, reflp: torch.Tensor,
                       dims: dict[str, int], rule: str) -> dict[str, Any]:
    """The FP64 whole-tensor comparison the checker made before chunking (compare.py at cf690b3), for one
    output."""
    spec = next(o for o in task.outputs if o.name == name)
    want_shape, want_dtype = spec.concrete_shape(dims), torch_dtype(spec.dtype)
    base = {"output": name, "shape_point": "p", "seed": 0}
    cand = got.double()
    ref = ref32.double()
    lowp = (ref32.to(want_dtype) if rule == "single_rounding" else reflp).double()
    bad = ~torch.isfinite(cand)
    if bool(bad.any()):
        first = _unravel(int(bad.reshape(-1).nonzero()[0]), want_shape)
        return OutputCheck(**base, ok=False, worst_index=first, reason=(
            f"output {name!r} has {int(bad.sum())} NaN/Inf values (first at {first}); an unwritten element, "
            "an overflow or 0 x inf (a mask multiplying -inf)")).model_dump()
    diff = (cand - ref).abs().reshape(-1)
    flat = int(diff.argmax())
    err = float(diff[flat])
    lowp_err = float((lowp - ref).abs().max())
    factor, floor = task.tolerance.for_output(name)
    allowed = factor * lowp_err + floor * max(1.0, float(ref.abs().max()))
    where = _unravel(flat, want_shape)
    ok = err <= allowed
    if ok and want_dtype.is_floating_point:
        scale = ref.abs().clamp_min(1.0)
        for p in (1, 2):
            e = float(torch.linalg.vector_norm(cand - ref, p))
            a = (factor * float(torch.linalg.vector_norm(lowp - ref, p))
                 + floor * float(torch.linalg.vector_norm(scale, p)))
            if e > a:
                return {**base, "ok": False, "max_abs_err": err, "allowed": allowed, "lowp_err": lowp_err,
                        "worst_index": where, "spread": (p, e, a)}
    return {**base, "ok": ok, "max_abs_err": err, "allowed": allowed, "lowp_err": lowp_err,
            "worst_index": where if err else None,
            "worst_value": float(cand.reshape(-1)[flat]) if err else None,
            "expected_value": float(ref.reshape(-1)[flat]) if err else None,
            "reason_head": "" if ok else f"output {name!r}: max error {err:.3g} at {where}"}


def _task(shape: list[str | int], dtype: str) -> Task:
    return Task.model_validate({
        "name": "chunked", "version": 1, "family": "forward", "description": "d",
        "inputs": [{"name": "x", "shape": ["M", "N"], "dtype": "float32"}],
        "outputs": [{"name": "out", "shape": shape, "dtype": dtype}],
        "shapes": {"small": [{"name": "p", "dims": {"M": 7, "N": 5, "L": 3}}],
                   "bench": [{"name": "p", "dims": {"M": 7, "N": 5, "L": 3}}]},
        "reference": "r.py:reference", "launch_budget": 4, "sol": {"flops": "M*N"},
    })


def _case(rng: random.Random, shape: tuple[int, ...],
          dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(candidate, FP32 reference, eager baseline) with the kinds of error a check meets."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    truth = torch.randn(shape, generator=gen) * rng.choice([1e-3, 1.0, 40.0])
    eager = (truth + torch.randn(shape, generator=gen) * 1e-2).to(dtype)
    noise = rng.choice([0.0, 1e-3, 1e-2, 5e-2])
    cand = truth + torch.randn(shape, generator=gen) * noise
    kind = rng.choice(["plain", "ties", "nan", "inf", "spike", "dropped", "everywhere", "ref-nan"])
    flat = cand.reshape(-1)
    # several elements at the same largest error: the first one is named
    if kind == "ties" and flat.numel() > 3:
        picks = sorted(rng.sample(range(flat.numel()), 3))
        for i in picks:
            flat[i] = truth.reshape(-1)[i] + 0.5
    elif kind in ("nan", "inf"):
        for i in rng.sample(range(flat.numel()), min(flat.numel(), rng.choice([1, 3]))):
            flat[i] = float("nan") if kind == "nan" else -float("inf")
    elif kind == "spike":
        flat[rng.randrange(flat.numel())] += 3.0
    elif kind == "dropped":
        cand = torch.where(truth.abs() < 0.5, torch.zeros_like(truth), truth)
    elif kind == "everywhere":  # every element near the largest error allowed: the norms fail, not the max
        cand = truth + 1.9 * float((eager.float() - truth).abs().max())
    elif kind == "ref-nan":
        truth.reshape(-1)[rng.randrange(flat.numel())] = float("nan")
    return cand.to(dtype), truth, eager


def same(a: float | None, b: float | None) -> bool:
    """Equal, NaN included (a NaN reference makes NaN errors, in both comparisons alike)."""
    return a == b or (a is not None and b is not None and a != a and b != b)


SHAPES: list[tuple[list[str | int], tuple[int, ...]]] = [
    (["M", "N"], (7, 5)), (["M"], (7,)), ([], ()), (["M", "L", "N"], (7, 3, 5)),
]


@pytest.mark.parametrize("elements", [1, 3, 5, 11, 16, 1000])
def test_chunked_comparison_matches_the_whole_tensor_one(monkeypatch, elements):
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", elements)
    rng = random.Random(elements)
    seen = set()
    for trial in range(120):
        symbolic, shape = SHAPES[trial % len(SHAPES)]
        dtype_name = rng.choice(["bfloat16", "float32"])
        task = _task(symbolic, dtype_name)
        cand, truth, eager = _case(rng, shape, torch_dtype(dtype_name))
        if trial % 5 == 0 and truth.dim() == 2:  # a non-contiguous reference (a transpose's view)
            truth = truth.t().contiguous().t()
        rule = rng.choice(["eager", "single_rounding"])
        (got,) = check_outputs(task, {"out": cand}, {"out": truth}, {"out": eager}, {"M": 7, "N": 5, "L": 3},
                               "p", 0, rule)
        want = whole_tensor_check(task, "out", cand, truth, eager, {"M": 7, "N": 5, "L": 3}, rule)
        seen.add((got.ok, "NaN/Inf" in got.reason, "norm" in got.reason))
        assert got.ok == want["ok"]
        assert got.worst_index == want["worst_index"], (trial, got, want)
        if "NaN/Inf" in want.get("reason", ""):
            assert got.reason == want["reason"]
            continue
        assert same(got.max_abs_err, want["max_abs_err"]) and same(got.lowp_err, want["lowp_err"])
        assert same(got.allowed, want["allowed"])
        if "spread" in want:
            p, e, a = want["spread"]
            assert f"the L{p} norm of the error, {e:.4g}, exceeds the allowed {a:.4g}" in got.reason
            continue
        assert "norm" not in got.reason
        assert same(got.worst_value, want["worst_value"]) and same(got.expected_value, want["expected_value"])
        assert got.reason.startswith(want["reason_head"])
        if not got.ok:
            assert BASELINE_TEXT[rule] in got.reason
    assert {(True, False, False), (False, True, False), (False, False, False), (False, False, True)} <= seen


def test_chunks_cover_every_element_once_in_whole_rows():
    for shape, elements in [((7, 5), 11), ((7, 5), 3), ((4,), 3), ((), 8), ((0, 3), 4), ((2, 3, 4), 12)]:
        spans = chunk_spans(shape, elements)
        n = 1
        for d in shape:
            n *= d
        assert [a for a, _ in spans] == sorted(a for a, _ in spans) and sum(b - a for a, b in spans) == n
        assert all(b == spans[i + 1][0] for i, (_, b) in enumerate(spans[:-1]))
        row = n // shape[0] if shape and shape[0] else 1
        if len(shape) > 1 and row <= elements:
            assert all(a % row == 0 for a, _ in spans)
    assert (chunk_spans((8192, 256000))
            == [(a, min(a + 65 * 256000, 8192 * 256000)) for a in range(0, 8192 * 256000, 65 * 256000)])


@pytest.mark.parametrize("elements", [1, 4, 7, 100])
def test_chunked_repeat_difference_matches_the_whole_tensor_one(monkeypatch, elements):
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", elements)
    gen = torch.Generator().manual_seed(elements)
    a = torch.randn(6, 5, generator=gen).bfloat16()
    for change in ("none", "small", "nan", "inf"):
        b = a.clone()
        if change == "small":
            b[3, 2] += 0.25
        elif change == "nan":
            b[5, 4] = float("nan")
        elif change == "inf":
            b[0, 0] = float("inf")
        diff = (a.double() - b.double()).abs()
        old = float(torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff).max())
        assert max_abs_difference(a, b) == old


# --- the estimate -------------------------------------------------------------------------------------------

GEMMA = ShapePoint(name="gemma2-2b-lmhead", dims={"M": 8192, "V": 256000, "K": 2304})


def gemma_task(tmp_path: Path) -> Task:
    """gemm_cross_entropy at the Gemma-2 2B LM head (256k vocabulary) as its one bench shape, in ``tmp_path``,
    with no stress set (the figures measured on the H200 had none; a test adds one where it counts it)."""
    ce = find_task("gemm_cross_entropy")
    data = ce.model_dump(mode="json")
    data.update(name="gemm_cross_entropy_gemma", human=None,
                shapes={"small": data["shapes"]["small"], "bench": [GEMMA.model_dump()]}, stress={})
    (tmp_path / "gemm_cross_entropy_gemma.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    shutil.copy(ce.reference_file, tmp_path / ce.reference_file.name)
    return Task.model_validate(data).bind_path(tmp_path / "gemm_cross_entropy_gemma.yaml")


def test_the_estimate_at_the_gemma_lm_head_from_its_tensor_sizes(tmp_path):
    task = gemma_task(tmp_path)
    M, V, K = 8192, 256000, 2304
    inp = M * K * 2 + V * K * 2 + M * 8  # x, w (bf16), targets (int64)
    inp32 = M * K * 4 + V * K * 4 + M * 8
    out = M * V * 2 + 2 * M * 4  # logits (bf16), lse and loss (fp32)
    ref = M * V * 4 + 2 * M * 4  # the FP32 reference's outputs
    # the reference's working memory, measured: the eager call's logits.float() and its logsumexp's temporary,
    # and a few per-row vectors
    work = reference_working_bytes(task, GEMMA.dims)
    assert 2 * M * V * 4 <= work <= 2 * M * V * 4 + 64 * M
    chunks = CHUNK_BUFFERS * 8 * CHUNK_ELEMENTS
    flush = 256 << 20
    need = memory_need(task, GEMMA, ["gpu_correctness"], 3)
    assert need.checker_bytes == 4 * out + ref + out + 2 * inp + inp32 + work + chunks
    assert need.runner_bytes == 2 * 3 * inp + 4 * out + 2 * ref + flush
    # The numbers docs/verification.md and bench/notes/2026-12-03-checker-memory.md quote: 48.0 GiB in the
    # checker and 38.3 GiB in its runner, 86.3 GiB in all (measured on the H200 with the torch emulator as the
    # candidate: 45.3 and 38.3 GiB).
    assert round(need.checker_bytes / GiB, 1) == 48.0 and round(need.runner_bytes / GiB, 1) == 38.3
    assert round(need.total_bytes / GiB, 1) == 86.3
    # The old checker's FP64 copies came to M x V x 8 bytes each (15.62 GiB), six or more at once in the
    # comparison.
    assert round(M * V * 8 / GiB, 2) == 15.62 and need.checker_bytes < 118.7 * GiB
    one = memory_need(task, GEMMA, ["gpu_correctness"], 1)  # one seed has a decoy: two sets, three calls
    assert one.runner_bytes == 2 * 2 * inp + 3 * out + 2 * ref + flush
    stressed = memory_need(task.model_copy(update={"stress": {"x": Init(std=64)}}), GEMMA,
                           ["gpu_correctness"], 3)
    # the stress set: one more
    assert stressed.checker_bytes == 5 * out + ref + out + 2 * inp + inp32 + work + chunks
    assert stressed.runner_bytes == 2 * 4 * inp + 5 * out + 2 * ref + flush
    assert round(stressed.checker_bytes / GiB, 1) == 51.9 and round(stressed.runner_bytes / GiB, 1) == 44.5
    timed = memory_need(task, GEMMA, ["profile"], 3)
    gemms = 2 * (M * K + V * K + M * V)
    assert (timed.checker_bytes
            == TIMING_SETS * inp + (ref + out) + out + max(out + work, inp32 + work, gemms, chunks))
    assert timed.runner_bytes == 2 * TIMING_SETS * inp + 2 * out + 2 * ref + flush
    # measured: 24.3, 30.5
    assert (round(timed.checker_bytes / GiB, 1), round(timed.runner_bytes / GiB, 1)) == (38.6, 30.5)
    both = memory_need(task, GEMMA, ["gpu_correctness", "profile", "tune"], 3)
    assert both.checker_bytes == max(need.checker_bytes, timed.checker_bytes)
    # no GPU stage, no GPU memory
    assert memory_need(task, GEMMA, ["correctness", "compile"], 3).total_bytes == 0


def test_a_task_that_cannot_fit_is_refused_in_one_line_with_the_numbers(tmp_path):
    task = gemma_task(tmp_path)
    plan = Plan(stages=["gpu_correctness", "profile"], backend="quack", shape_set="bench")
    assert memory_refusal(task, plan, 130 * GiB, 141 * GiB) is None  # an idle H200
    line = memory_refusal(task, plan, 40 * GiB, 141 * GiB)
    assert line is not None and "\n" not in line
    assert line == (
        "task gemm_cross_entropy_gemma does not fit this GPU: at bench shape gemma2-2b-lmhead (M=8192, "
        "V=256000, K=2304) with 3 seed(s) the checker needs about 48.0 GiB and its runner 38.3 GiB (86.3 GiB "
        "in all), and the device has 40.0 GiB free of 141.0 GiB"
    )
    # the CPU stages need no device memory
    assert memory_refusal(task, Plan(stages=["correctness"]), 1) is None
    small = Plan(stages=["gpu_correctness"], backend="quack", shape_set="small")
    assert memory_refusal(task, small, 40 * GiB) is None


#: Issue 48's task: cross-entropy over Qwen3-8B's vocabulary that writes no logits, only the per-row
#: statistics.
QWEN3 = ShapePoint(name="qwen3-8b-lmhead", dims={"M": 16384, "V": 151936, "K": 4096})
LOSS_ONLY_REFERENCE = """import torch


def reference(x, w, targets, *, ignore_index):
    lf = (x @ w.t()).float()
    lse = torch.logsumexp(lf, dim=-1)
    counted = targets != ignore_index
    picked = lf.gather(1, torch.where(counted, targets, 0)[:, None])[:, 0]
    return {"lse": lse, "loss": torch.where(counted, lse - picked, 0.0)}
"""


def loss_only_task(tmp_path: Path) -> Task:
    data = find_task("gemm_cross_entropy").model_dump(mode="json")
    data.update(name="cross_entropy_loss_only", human=None, reference="loss_only.py:reference",
                outputs=[o for o in data["outputs"] if o["name"] != "logits"],
                shapes={"small": data["shapes"]["small"], "bench": [QWEN3.model_dump()]})
    (tmp_path / "loss_only.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "loss_only.py").write_text(LOSS_ONLY_REFERENCE)
    return find_task(str(tmp_path / "loss_only.yaml"))


def test_a_reference_whose_temporaries_dwarf_its_outputs_is_estimated_by_them(tmp_path):
    """Its outputs are two per-row vectors; its reference builds M x V FP32 logits and a logsumexp temporary
    as large (the eager call's bf16 logits are gone once copied): 18.5 GiB at Qwen3-8B's head, where the old
    guess (two output-sized temporaries) said 128 KiB and the whole estimate 5.1 GiB."""
    task = loss_only_task(tmp_path)
    M, V, K = QWEN3.dims["M"], QWEN3.dims["V"], QWEN3.dims["K"]
    logits = 2 * M * V * 4  # the FP32 logits and logsumexp's (logits - max)
    work = reference_working_bytes(task, QWEN3.dims)
    assert logits <= work <= logits + 64 * M and round(work / GiB, 1) == 18.5
    inputs, upcast = M * K * 2 + V * K * 2 + M * 8, M * K * 4 + V * K * 4 + M * 8
    plan = Plan(stages=["gpu_correctness", "profile"], backend="quack", shape_set="bench")
    need = memory_need(task, QWEN3, plan.stages, 3)
    # at least the reference's own real need, and its inputs'
    assert need.checker_bytes >= 2 * inputs + upcast + logits
    # a 24 GiB GPU: refused before any work, with the numbers
    line = memory_refusal(task, plan, 24 * GiB, 24 * GiB)
    # (the runner holds its stress set too: a log-sum-exp has one by default)
    assert line == (
        "task cross_entropy_loss_only does not fit this GPU: at bench shape qwen3-8b-lmhead (M=16384, "
        "V=151936, K=4096) with 3 seed(s) the checker needs about 25.0 GiB and its runner 10.5 GiB (35.5 GiB "
        "in all), and the device has 24.0 GiB free of 24.0 GiB"
    )
    assert memory_refusal(task, plan, 130 * GiB, 141 * GiB) is None


def test_verify_refuses_a_task_that_cannot_fit_before_any_work(capsys, monkeypatch, tmp_path):
    gemma_task(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (40 * GiB, 141 * GiB))
    started = []
    monkeypatch.setattr("coda_agent.cli.verify_cmd.verify", lambda *a, **k: started.append(a))
    candidate = tmp_path / "k.py"
    candidate.write_text("def forward(x, w, targets, *, ignore_index):\n    return {}\n")
    code, out, err = cli(capsys, "verify", str(tmp_path / "gemm_cross_entropy_gemma.yaml"), str(candidate),
                         "--backend", "quack")
    assert code == 2 and not started, out + err
    assert err.startswith(
        "error: task gemm_cross_entropy_gemma does not fit this GPU: at bench shape gemma2-2b-lmhead")
    # 3 seeds
    assert err.count("\n") == 1 and "40.0 GiB free of 141.0 GiB" in err and "86.3 GiB in all" in err


# --- peaks in the verdict -----------------------------------------------------------------------------------


def test_a_stage_records_its_peaks_and_old_records_still_read():
    old = StageResult.model_validate({"stage": "gpu_correctness", "outcome": "passed", "seconds": 3.0})
    assert old.memory is None
    mem = StageMemory(checker_peak_bytes=40 * GiB + GiB // 5, runner_peak_bytes=30 * GiB,
                      device_total_bytes=int(139.8 * GiB))
    assert mem.describe() == "peak checker 40.2 + runner 30.0 of 139.8 GiB"
    assert StageMemory(runner_peak_bytes=GiB).describe() == "peak runner 1.0 GiB"
    assert StageMemory().describe() == ""
    v = Verdict(task="t", task_version=1, backend="quack", outcome="passed",
                stages=[StageResult(stage="gpu_correctness", outcome="passed", memory=mem)])
    again = Verdict.model_validate_json(v.model_dump_json())
    assert again.stages[0].memory == mem


def test_the_runners_reported_peak_is_validated():
    from coda_agent.runner.protocol import MAX_REPORTED_BYTES, reported_bytes

    assert reported_bytes(5 * GiB) == 5 * GiB and reported_bytes(0) == 0
    for bad in (-1, 1.5, "5", True, None, [1], MAX_REPORTED_BYTES + 1):
        assert reported_bytes(bad) is None


def test_verify_prints_a_stages_peaks_on_its_line(capsys):
    from coda_agent.cli.verify_cmd import print_verdict

    mem = StageMemory(checker_peak_bytes=2 * GiB, runner_peak_bytes=3 * GiB, device_total_bytes=140 * GiB)
    print_verdict(Verdict(task="t", task_version=1, backend="quack", outcome="passed",
                          stages=[StageResult(stage="gpu_correctness", outcome="passed", seconds=1.0,
                                              memory=mem)]))
    line = next(s for s in capsys.readouterr().out.splitlines() if "gpu_correctness" in s)
    assert line.endswith("1.0 s  peak checker 2.0 + runner 3.0 of 140.0 GiB")


def test_run_refuses_a_task_that_cannot_fit_before_its_record_is_made(capsys, monkeypatch, tmp_path):
    gemma_task(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (40 * GiB, 141 * GiB))
    runs = tmp_path / "runs"
    code, out, err = cli(capsys, "run", str(tmp_path / "gemm_cross_entropy_gemma.yaml"), "--model",
                         "mock/echo", "--runs-dir", str(runs))
    assert code == 2, out + err
    assert err.startswith(
        "error: task gemm_cross_entropy_gemma does not fit this GPU: at bench shape gemma2-2b-lmhead")
    assert err.count("\n") == 1 and "86.3 GiB in all" in err  # the correctness check is the larger
    assert not runs.exists() or not any(runs.iterdir())
