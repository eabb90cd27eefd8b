"""The tolerance rule and its two baselines: eager (the reference in the task dtype) and CODA's single
rounding."""

from __future__ import annotations

import torch

from coda_agent.tasks import find_task
from coda_agent.verifier import Plan, verify
from coda_agent.verifier.compare import check_outputs, rounded_to

from .conftest import cli

K1 = find_task("gemm_rmsnorm")  # one bf16 output, "out"
K0 = find_task("gemm_residual_rmsnorm")  # h, normed (bf16) and rstd (fp32)
DIMS = {"M": 4, "N": 8, "K": 16}
ULP = 2.0**-7  # bf16 spacing in [1, 2)


def bf16_checks(candidate: float, baseline: str | None) -> list:
    """``out`` filled with one value: truth 1 + 0.3 ulp (bf16 rounds it once to 1), an eager result two ulps
    up."""
    truth = torch.full((4, 8), 1.0 + 0.3 * ULP)
    eager = torch.full((4, 8), 1.0 + 2 * ULP).bfloat16()
    cand = torch.full((4, 8), candidate).bfloat16()
    return check_outputs(K1, {"out": cand}, {"out": truth}, {"out": eager}, DIMS, "tiny", 0, baseline)


def test_eager_baseline_is_the_default_and_scales_with_the_task_dtype_reference():
    (check,) = bf16_checks(1.0 + ULP, None)
    assert K1.tolerance.baseline == "eager" and check.baseline == "eager"
    assert check.ok and abs(check.lowp_err - 1.7 * ULP) < 1e-6


def test_single_rounding_allows_only_the_final_rounding():
    """One ulp off passes the eager rule (the eager reference is 1.7 ulps off) and fails CODA's."""
    (check,) = bf16_checks(1.0 + ULP, "single_rounding")
    assert check.baseline == "single_rounding" and not check.ok
    assert abs(check.lowp_err - 0.3 * ULP) < 1e-6  # the truth rounded once to bf16
    assert "2 x single-rounding reference error" in check.reason
    (exact,) = bf16_checks(1.0, "single_rounding")  # the correctly rounded answer
    assert exact.ok


def test_single_rounding_leaves_an_fp32_output_only_the_floor():
    m = 4
    truth = {"h": torch.ones(m, 8), "normed": torch.ones(m, 8), "rstd": torch.full((m,), 0.5)}
    eager = {k: v.bfloat16() if k != "rstd" else v + 1e-3 for k, v in truth.items()}

    def rstd_check(off: float, baseline: str) -> object:
        cand = {"h": truth["h"].bfloat16(), "normed": truth["normed"].bfloat16(), "rstd": truth["rstd"] + off}
        checks = check_outputs(K0, cand, truth, eager, {"M": m, "N": 8, "K": 16}, "tiny", 0, baseline)
        return next(c for c in checks if c.output == "rstd")

    assert rstd_check(1e-4, "eager").ok  # within 2 x the eager 1e-3
    tight = rstd_check(1e-4, "single_rounding")
    assert not tight.ok and tight.lowp_err == 0 and tight.allowed == 1e-5  # floor x max(1, |ref|)
    assert rstd_check(5e-6, "single_rounding").ok


def test_an_fp32_output_rounded_to_16_bits_on_its_way_says_so():
    """A weight gradient's FP32 output rounded to bf16 first was x261 the tolerance, read as a wrong formula
    (a manual seat's): the check names the rounding, which no ratio does."""
    assert rounded_to(-68.0, -68.2488) == "bfloat16"  # bf16 steps are 0.5 in [64, 128)
    assert rounded_to(-68.5, -68.2) is None  # a bf16 value, but more than half a step away
    assert rounded_to(1.0 + 2.0**-10, 1.0006) == "float16"  # no bf16 value, an fp16 one
    assert rounded_to(2.5, 2.5) is None and rounded_to(1.2345678, 1.2345) is None
    m = 4
    truth = {"h": torch.ones(m, 8), "normed": torch.ones(m, 8), "rstd": torch.full((m,), 0.3)}
    cand = {"h": truth["h"].bfloat16(), "normed": truth["normed"].bfloat16(),
            "rstd": truth["rstd"].bfloat16().float()}
    checks = check_outputs(K0, cand, truth, truth, {"M": m, "N": 8, "K": 16}, "tiny", 0, "single_rounding")
    rstd = next(c for c in checks if c.output == "rstd")
    assert not rstd.ok and rstd.rounded_to == "bfloat16"
    assert "got is expected rounded to bfloat16" in rstd.reason
    assert all(c.rounded_to is None for c in checks if c.output != "rstd")  # 16-bit outputs are never flagged


def test_an_output_off_by_a_constant_factor_says_so():
    """A mean for a sum came back x1313 the tolerance and "its formula differs" (a manual seat's L2 norm, off
    by sqrt(192) throughout): the check names the factor; noise or a 1% slip names none."""
    truth = torch.randn(4, 8) + 2.0
    (check,) = check_outputs(K1, {"out": (truth * 13.9).bfloat16()}, {"out": truth},
                             {"out": truth.bfloat16()}, DIMS, "tiny", 0)
    assert not check.ok and check.factor is not None and abs(check.factor - 13.9) < 0.1
    assert "x expected throughout" in check.reason
    (noisy,) = check_outputs(K1, {"out": (truth + torch.randn(4, 8)).bfloat16()}, {"out": truth},
                             {"out": truth.bfloat16()}, DIMS, "tiny", 0)
    assert not noisy.ok and noisy.factor is None


def test_a_wrong_block_of_columns_or_rows_is_named():
    """A manual seat normalised V's columns too and read only the worst element ("at [41, 597]"): the check
    names the columns (or rows: a partial last tile's) where every element past the allowed error lies, in a
    few runs; errors everywhere, or scattered, name none."""
    dims = {"M": 200, "N": 512, "K": 16}
    truth = torch.randn(200, 512) + 2.0
    wrong_v = truth.clone()
    wrong_v[:, 320:] *= 1.5
    (check,) = check_outputs(K1, {"out": wrong_v.bfloat16()}, {"out": truth}, {"out": truth.bfloat16()}, dims,
                             "tiny", 0)
    assert not check.ok and check.reason.endswith("; every element off by more than that is in columns "
                                                  "320-511 of 512")
    tail = truth.clone()
    tail[192:, :64] += 1.0
    tail[192:, 128:192] += 1.0
    (check,) = check_outputs(K1, {"out": tail.bfloat16()}, {"out": truth}, {"out": truth.bfloat16()}, dims,
                             "tiny", 0)
    assert check.reason.endswith("is in rows 192-199 of 200 and columns 0-63, 128-191 of 512")
    scattered = truth.clone()
    scattered[::7, ::5] += 1.0
    (check,) = check_outputs(K1, {"out": scattered.bfloat16()}, {"out": truth}, {"out": truth.bfloat16()},
                             dims, "tiny", 0)
    assert not check.ok and "every element off by more" not in check.reason
    # a few rows of their own, scattered (a kernel without eps at the planted tiny rows: a manual seat's
    # reason named one element of 13 failing rows): counted, the first named
    tiny_rows = truth.clone()
    tiny_rows[[3, 41, 77, 150, 199]] += 1.0
    (check,) = check_outputs(K1, {"out": tiny_rows.bfloat16()}, {"out": truth}, {"out": truth.bfloat16()},
                             dims, "tiny", 0)
    assert check.reason.endswith("; every element off by more than that is in 5 scattered rows of 200 "
                                 "(3, 41, 77, ...)"), check.reason


def test_a_wrong_dtype_names_what_sets_it():
    """Both ways an output gets its dtype: gemm()'s out_dtype, or a host op's type promotion (a manual-seat
    author's addcmul of bf16 tensors with an FP32 rstd returned FP32 and was pointed at out_dtype only)."""
    (check,) = check_outputs(K1, {"out": torch.ones(4, 8)}, {"out": torch.ones(4, 8)},
                             {"out": torch.ones(4, 8).bfloat16()}, DIMS, "tiny", 0)
    assert not check.ok and "has dtype torch.float32, expected torch.bfloat16" in check.reason
    assert "gemm() stores D and its extra outputs in its out_dtype" in check.reason
    assert "a host op's result follows torch's type promotion" in check.reason
    assert "pass that op out= a torch.bfloat16 tensor" in check.reason


def test_a_task_can_choose_single_rounding():
    task = K1.model_copy(
        update={"tolerance": K1.tolerance.model_copy(update={"baseline": "single_rounding"})})
    (check,) = check_outputs(task, {"out": torch.ones(4, 8).bfloat16()}, {"out": torch.ones(4, 8)},
                             {"out": torch.ones(4, 8).bfloat16()}, DIMS, "tiny", 0)
    assert check.baseline == "single_rounding"
    # every element exact: no worst element to name (a table read "worst at [0]", from the manual seat)
    assert check.max_abs_err == 0 and check.worst_index is None and check.worst_value is None


def test_a_missing_output_names_what_came_back_instead():
    truth = torch.ones(4, 8)
    checks = check_outputs(K1, {"y": truth.bfloat16()}, {"out": truth}, {"out": truth}, DIMS, "tiny", 0)
    check = next(c for c in checks if c.output == "out")
    assert (not check.ok
            and check.reason
            == "output 'out' is missing from forward()'s dict (it returned 'y', which the task does not "
               "declare)")


def test_the_verdict_names_the_baseline_a_plan_chose():
    v = verify(K0, K0.human_file.read_text(), Plan(tolerance_baseline="single_rounding"))
    assert v.passed, v.reason  # the fused kernel rounds only what it stores
    checks = v.stage("correctness").checks
    assert checks and {c.baseline for c in checks} == {"single_rounding"}


def test_verify_command_takes_the_baseline_and_prints_it(capsys):
    code, out, _ = cli(capsys, "verify", "gemm_rmsnorm", "--tolerance-baseline", "single-rounding")
    assert code == 0 and "tolerance baseline: single-rounding" in " ".join(out.split())
    code, _, err = cli(capsys, "verify", "gemm_rmsnorm", "--tolerance-baseline", "tight")
    assert code == 2 and "use eager or single-rounding" in err
    # the task file's spelling too (a manual seat typed it and was refused)
    code, out, _ = cli(capsys, "verify", "gemm_rmsnorm", "--tolerance-baseline", "single_rounding")
    assert code == 0 and "tolerance baseline: single-rounding" in " ".join(out.split())


def test_a_16_bit_output_is_held_to_its_error_norms_not_only_to_its_largest_error():
    """A few large elements set the max-abs bound; dropping the many small ones must still fail (a softmax
    tail)."""
    gen = torch.Generator().manual_seed(0)
    truth = torch.rand(4, 8, generator=gen) * 0.05
    truth[:, 0] = 4.0  # the large elements, where the eager reference is a whole bf16 step (1/32) off
    eager = truth.bfloat16()
    eager[:, 0] = 4.0 + 2.0**-5
    dropped = torch.where(truth > 1.0, truth, torch.zeros_like(truth)).bfloat16()
    (check,) = check_outputs(K1, {"out": dropped}, {"out": truth}, {"out": eager}, DIMS, "tiny", 0)
    assert not check.ok and "L1 norm of the error" in check.reason and check.max_abs_err <= check.allowed
    (honest,) = check_outputs(K1, {"out": truth.bfloat16()}, {"out": truth}, {"out": eager}, DIMS, "tiny", 0)
    assert honest.ok


def test_a_kernel_that_is_not_0_where_both_references_are_fails_past_a_few_boundary_crossings():
    """A leaky ReLU squared (slope 0.03) stays within the max and norm rules, set by the large positive
    values; where the reference's ReLU gives exactly 0 it is not. A kernel whose pre-activation crosses 0
    at a few elements only (another summation order) passes."""
    gen = torch.Generator().manual_seed(0)
    pre = torch.randn(16, 64, generator=gen) * 4
    truth = pre.clamp_min(0) ** 2
    dims = {"M": 16, "N": 64, "K": 16}
    eager = truth.bfloat16()
    leaky = torch.where(pre > 0, pre, 0.03 * pre).pow(2).bfloat16()
    (check,) = check_outputs(K1, {"out": leaky}, {"out": truth}, {"out": eager}, dims, "tiny", 0)
    assert not check.ok and "exactly 0 at" in check.reason and "leaky slope" in check.reason
    assert check.max_abs_err <= check.allowed  # the max rule alone would pass it
    crossed = truth.clone()
    zeros = (truth == 0).nonzero()
    crossed[tuple(zeros[:5].t())] = 1e-3  # five elements just past the boundary
    (honest,) = check_outputs(K1, {"out": crossed.bfloat16()}, {"out": truth}, {"out": eager}, dims, "tiny",
                              0)
    assert honest.ok


ARGMAX_TASK = """\
name: argmax_head
version: 1
family: forward
description: greedy decoding's head, the logits and their argmax.
inputs:
  - {name: x, shape: [M, K], dtype: bfloat16}
  - {name: w, shape: [V, K], dtype: bfloat16}
outputs:
  - {name: logits, shape: [M, V], dtype: bfloat16}
  - {name: tok, shape: [M], dtype: int64}
shapes:
  small: [{name: tiny, dims: {M: 8, V: 64, K: 16}}]
  bench: [{name: b, dims: {M: 8, V: 64, K: 16}}]
reference: ref.py:reference
launch_budget: 3
sol: {flops: "2*M*V*K"}
gemms: [[M, V, K]]
"""


def test_an_integer_output_differs_from_the_reference_only_about_as_often_as_the_baseline(tmp_path):
    """Its largest error alone let an argmax 100 places off through, where the baseline's near ties were
    232 places apart: the count of wrong elements is held to the baseline's."""
    from coda_agent.tasks import load_task

    (tmp_path / "ref.py").write_text("def reference(x, w):\n    l = x @ w.t()\n    return {'logits': l, "
                                     "'tok': l.argmax(-1)}\n")
    (tmp_path / "t.yaml").write_text(ARGMAX_TASK)
    task = load_task(tmp_path / "t.yaml")
    logits = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    truth = {"logits": logits, "tok": logits.argmax(-1)}
    eager_tok = truth["tok"].clone()
    eager_tok[0] += 50  # one near tie the task dtype decides otherwise
    eager = {"logits": logits.bfloat16(), "tok": eager_tok}

    def tok_check(tok: torch.Tensor):
        cand = {"logits": logits.bfloat16(), "tok": tok}
        return next(c for c in check_outputs(task, cand, truth, eager, {"M": 8, "V": 64, "K": 16}, "tiny", 0)
                    if c.output == "tok")

    shifted = tok_check(truth["tok"] + 10)
    assert not shifted.ok and "differs from the FP32 reference at 8 of 8 elements" in shifted.reason
    one_tie = truth["tok"].clone()
    one_tie[3] -= 7
    assert tok_check(one_tie).ok and tok_check(eager_tok).ok


def test_an_infinite_allowance_judges_nothing():
    """A task-dtype reference that overflows only at a large shape (validate runs the small ones) made the
    allowance infinite, and any output passed (a red-team pass)."""
    truth = torch.ones(4, 8)
    eager = torch.full((4, 8), float("inf")).bfloat16()
    (check,) = check_outputs(K1, {"out": torch.zeros(4, 8).bfloat16()}, {"out": truth}, {"out": eager}, DIMS,
                             "tiny", 0)
    assert not check.ok and "the tolerance is not finite" in check.reason
