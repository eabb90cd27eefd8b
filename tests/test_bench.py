"""The bench on the CPU: timing statistics and interleaving, speed of light, baselines, the task's gemms
field, result rows, rendering, the CLI's no-GPU answer and the tuner's config tables."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import Future
from datetime import datetime, timezone

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from coda_agent import provenance
from coda_agent.bench import report, runner, tune
from coda_agent.bench.results import BenchRow, BenchRun
from coda_agent.cli import app
from coda_agent.measure import peaks, timing
from coda_agent.measure.baselines import baseline_variants, cublas_gemms, gemm_dtype, gemm_layouts
from coda_agent.measure.timing import Timing
from coda_agent.tasks import find_task
from coda_agent.tasks.loader import TaskError, load_task
from coda_agent.verifier import Plan, Tuned, gpu
from coda_agent.verifier.stages import Context, timed_by_part
from coda_agent.verifier.verdict import Outcome, ShapeTuning, StageResult, TunedGemm, Verdict

from .conftest import cli

K0 = find_task("gemm_residual_rmsnorm")
PEAKS = peaks.Peaks(tflops_bf16=800.0, hbm_tbps=4.0, how="test")


def test_percentiles_interpolate_and_summaries_carry_the_spread():
    s = [float(x) for x in range(1, 11)]
    assert timing.percentile(s, 50) == 5.5
    assert timing.percentile(s, 10) == pytest.approx(1.9)
    t = timing.summarize([5.0, 1.0, 3.0])
    assert (t.median_us, t.p10_us, t.p90_us, t.reps) == (3.0, pytest.approx(1.4), pytest.approx(4.6), 3)
    with pytest.raises(ValueError):
        timing.percentile([], 50)


def test_rep_plan_sizes_runs_to_the_target_within_bounds():
    plan = timing.RepPlan(target_s=0.2, min_reps=15, max_reps=100)
    assert plan.reps_for(1000.0) == 100  # 1 ms: 200 wanted, capped
    assert plan.reps_for(5000.0) == 40
    assert plan.reps_for(1e6) == 15


def test_interleaved_timing_rotates_order_and_ranks_variants():
    calls: list[str] = []

    def sleeper(name: str, seconds: float):
        def fn() -> None:
            calls.append(name)
            time.sleep(seconds)

        return fn

    variants = {"fast": sleeper("fast", 0.0005), "slow": sleeper("slow", 0.003)}
    # the probe sizes the run from the slowest variant (6 reps of a 3 ms one here); pinned at 6, so that a
    # loaded machine's longer sleeps cannot size it smaller
    assert timing.RepPlan(warmup=1, target_s=0.02, min_reps=4, max_reps=6).reps_for(3000) == 6
    plan = timing.RepPlan(warmup=1, target_s=0.02, min_reps=6, max_reps=6)
    t = timing.time_interleaved(variants, timing.Clock("cpu"), plan)
    assert t["fast"].median_us < t["slow"].median_us
    assert t["slow"].median_us >= 3000
    assert t["fast"].reps == t["slow"].reps == 10  # 6 asked for, in whole batches of timing.BATCH
    timed = calls[2 + 6 :]  # after the warm-up and the 3 probe reps (one batch of 3 each)
    # batch by batch, the start rotating
    assert timed == ["fast"] * 5 + ["slow"] * 5 + ["slow"] * 5 + ["fast"] * 5
    # each round's batch median, for paired ratios
    assert len(t["fast"].rounds_us) == len(t["slow"].rounds_us) == 2
    assert 2 < timing.paired_ratio(t["slow"], t["fast"]) < 10


def test_speed_of_light_takes_the_binding_roof():
    assert peaks.speed_of_light_us(8e12, 1e6, PEAKS) == pytest.approx(1e4)  # compute-bound: 8 TFLOP at 800
    assert peaks.speed_of_light_us(1e6, 4e9, PEAKS) == pytest.approx(1e3)  # memory-bound: 4 GB at 4 TB/s


def test_the_compute_ceiling_is_the_best_matmul_shape_and_says_which(monkeypatch):
    """A ceiling below what cuBLAS reaches at some shape is no ceiling: the peak is the best of its shapes."""
    times_us = {"64x64x64": 100.0, "32x16x128": 20.0, "copy": 10.0}  # 5.2 and 6.6 GFLOP/s

    def fixed(variants, clock, plan):
        assert set(variants) == set(times_us)
        for run in variants.values():
            run()  # each variant runs on this device
        return {name: timing.Timing(median_us=us) for name, us in times_us.items()}

    monkeypatch.setattr(peaks, "time_interleaved", fixed)
    p = peaks.measure_peaks(timing.Clock("cpu"), shapes=((64, 64, 64), (32, 16, 128)), copy_bytes=1 << 20)
    assert p.tflops_bf16 == pytest.approx(2 * 32 * 16 * 128 / 20e-6 / 1e12)
    assert p.hbm_tbps == pytest.approx(2 * (1 << 20) / 10e-6 / 1e12)
    assert "the best of 2 shapes on random data: 32x16x128 (against 64x64x64 0 TFLOP/s)" in p.how
    assert p.label().startswith("measured on this GPU: 0 TFLOP/s bf16")


def test_gemms_field_evaluates_and_is_validated(tmp_path):
    assert K0.gemm_shapes({"M": 8, "N": 16, "K": 32}) == [(8, 16, 32)]
    text = K0.path.read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("gemms: [[M, N, K]]", "gemms: [[M, N]]"))
    with pytest.raises(TaskError, match=r"line \d+: gemms\[0\]: each entry must be \[M, N, K\]"):
        load_task(bad)
    bad.write_text(text.replace("gemms: [[M, N, K]]", "gemms: [[M, 2*Q, K]]"))
    with pytest.raises(TaskError, match=r"line \d+: gemms\[0\]\[1\]: uses Q, which no shape binds"):
        load_task(bad)


def test_cublas_baseline_runs_the_tasks_gemms_in_the_task_dtype():
    fn = cublas_gemms(K0, {"M": 8, "N": 16, "K": 32}, device="cpu")
    (out,) = fn()
    assert out.shape == (8, 16) and out.dtype == gemm_dtype(K0) == torch.bfloat16
    assert cublas_gemms(K0.model_copy(update={"gemms": []}), {"M": 8, "N": 16, "K": 32}, device="cpu") is None


def test_the_cublas_baseline_multiplies_in_the_layout_the_reference_does(tmp_path, monkeypatch):
    """A dgrad's ``dz @ w`` reads an N-major weight: cuBLAS is timed on that product, not on ``x @ w.T``."""
    assert (gemm_layouts(find_task("gemm_rmsnorm_bwd")) == gemm_layouts(find_task("gemm_swiglu_bwd"))
            == ("x @ w",))
    assert (gemm_layouts(K0) == ("x @ w.T",)
            and gemm_layouts(find_task("gemm_rmsnorm_gemm")) == ("x @ w.T",) * 2)
    text = K0.path.read_text().replace("reference: gemm_residual_rmsnorm.py:reference",
                                       "reference: ref.py:reference")
    (tmp_path / "t.yaml").write_text(text.replace("human: human/gemm_residual_rmsnorm.py", ""))
    (tmp_path / "ref.py").write_text((K0.path.parent / "gemm_residual_rmsnorm.py").read_text().replace(
        "x @ w.t()", "x.t().contiguous().t() @ w.t().contiguous()"))  # A stored (K, M), B stored (K, N)
    task = load_task(tmp_path / "t.yaml")
    assert gemm_layouts(task) == ("x.T @ w",)
    strides = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: strides.append((a.stride(), b.stride())) or real_mm(a, b))
    (out,) = cublas_gemms(task, {"M": 8, "N": 16, "K": 32}, device="cpu")()
    assert out.shape == (8, 16) and strides == [((1, 8), (16, 1))]


def test_baselines_include_eager_reference_and_cublas():
    dims = K0.shape("small", "tiny")[0].dims
    inputs = K0.make_inputs(dims, 0)
    v = baseline_variants(K0, dims, inputs, device="cpu")
    assert set(v) == {"eager", "cublas"}
    assert set(v["eager"]()) == {"h", "normed", "rstd"}


def test_the_timing_sets_references_stay_while_the_device_has_room_for_them(monkeypatch):
    """Past TIMING_REFS_BYTES the timer keeps one set's references (an LM head's run to GiBs), unless the
    device's free memory holds two more sets' and the runner's peak at the time: then a checked round never
    runs one again."""
    computed = []

    def reference(task, inputs):
        computed.append(inputs["x"])
        return {"out": torch.zeros(1024)}, {"out": torch.zeros(1024)}  # 8 KiB a set

    monkeypatch.setattr(gpu, "references", reference)
    monkeypatch.setattr(gpu, "TIMING_REFS_BYTES", 16 << 10)  # three sets' 24 KiB pass it
    for free, kept in ((64 << 10, 3), (40 << 10, 1)):
        timer = gpu.ShapeTimer.__new__(gpu.ShapeTimer)
        timer.ctx = Context(task=K0, source="", plan=Plan(), deadline=0.0)
        timer.device, timer.refs = "cpu", {}
        timer.client = type("Runner", (), {"peak_bytes": 32 << 10})()  # room is 2 x 8 KiB + the runner's 32
        timer.ids = ["a", "b", "c"]
        timer.inputs = {i: {"x": i} for i in timer.ids}
        monkeypatch.setattr(gpu, "free_bytes", lambda device, free=free: free)
        computed.clear()
        for i in ["a", "b", "c", "a", "b", "c"]:
            timer._references(i)
        assert len(timer.refs) == kept and len(computed) == (3 if kept == 3 else 6)


def test_timing_stage_times_the_candidate_with_its_baselines_on_the_emulator():
    ctx = Context(task=K0, source=K0.human_file.read_text(), plan=Plan(shape_names=["tiny"], seeds=[0]),
                  deadline=time.monotonic() + 120)
    res = timed_by_part(lambda c: gpu.run_timing(c, device="cpu", backend_name="torch",
                                                 plan=timing.RepPlan(warmup=1, target_s=0.01, min_reps=3,
                                                                     max_reps=3)))(ctx)
    assert res.outcome is Outcome.PASSED, res.reason
    tiny = res.timings["tiny"]
    assert tiny.compiled is None and set(tiny.baselines()) == {"eager", "cublas"}
    for t in (tiny.candidate, *tiny.baselines().values()):
        assert t.reps == 3 and t.p10_us <= t.median_us <= t.p90_us and t.bound in ("events", "wall")
        # one round of one batch of 3, for the paired ratios
        assert len(t.rounds_us) == 1 and t.rounds_us[0] > 0
    assert res.reason.startswith("median tiny:")
    # the runner's host clock around forward(): on the CPU it is the call's whole time; the checker's
    # baselines have none
    assert tiny.candidate.host_median_us == tiny.candidate.events_median_us
    assert all(t.host_median_us is None and not t.host_bound for t in tiny.baselines().values())
    # where the shape's wall time went, for the bench's progress line
    warm = ["warm-up: candidate", "warm-up: eager", "warm-up: cublas", "warm-up: sizing"]
    parts = ["timed: traced", "timed: candidate", "timed: transfer", "timed: checks", "timed: eager",
             "timed: cublas"]
    assert (list(tiny.seconds) == ["setup", "warm-up", *warm, "timed", *parts, "close"]
            and all(s >= 0 for s in tiny.seconds.values()))
    # the rounds' parts (each rounded: a fast round is 0.0)
    assert 0 <= sum(tiny.seconds[p] for p in parts) <= tiny.seconds["timed"] + 0.05
    # each variant's, and the sizing
    assert abs(sum(tiny.seconds[p] for p in warm) - tiny.seconds["warm-up"]) <= 0.05
    # the stage's parts: the shapes' phases by their parts, with the runner's start and stop
    assert set(res.seconds_by_part) == {"runner start", "setup", *warm, *parts, "close", "runner stop"}
    assert (all(v >= 0 for v in res.seconds_by_part.values())
            and sum(res.seconds_by_part.values()) <= res.seconds + 0.05)
    bench_verdict = Verdict(task=K0.name, task_version=1, backend="torch", outcome=Outcome.PASSED,
                            stages=[res.model_copy(update={"stage": "bench"})])
    assert re.fullmatch(r"setup \d+ s, warm-up \d+ s \(candidate \d+ s, eager \d+ s, cublas \d+ s, sizing "
                        r"\d+ s\), timed \d+ s \(traced \d+ s, candidate \d+ s, transfer \d+ s, checks \d+ "
                        r"s, eager \d+ s, cublas \d+ s\), close \d+ s over 1 "
                        r"shape", runner.where_time_went(bench_verdict))
    assert runner.where_time_went(_verdict("gpu_correctness", {})) == ""


def test_only_the_timed_batch_of_a_turn_keeps_a_call_for_the_output_check(monkeypatch):
    """A turn's traced batch feeds no number (its kernels are judged); its twin, timed, has one call
    checked."""
    from collections import Counter

    from coda_agent.verifier.client import RunnerClient

    batches: Counter[tuple[bool, int]] = Counter()
    real = RunnerClient.run

    def spy(self, calls, keep, dry=False, trace=True):
        if not dry:
            batches[(trace, len(keep))] += 1
        return real(self, calls, keep=keep, dry=dry, trace=trace)

    monkeypatch.setattr(RunnerClient, "run", spy)
    ctx = Context(task=K0, source=K0.human_file.read_text(), plan=Plan(shape_names=["tiny"], seeds=[0]),
                  deadline=time.monotonic() + 120)
    res = gpu.run_timing(ctx, device="cpu", backend_name="torch",
                         plan=timing.RepPlan(warmup=1, target_s=0.01, min_reps=10, max_reps=10))
    assert res.outcome is Outcome.PASSED, res.reason
    # the warm-up (untraced, unchecked), the sizing probe (traced, checked), then two turns of 5 calls
    assert batches == {(False, 0): 1, (True, 1): 1, (True, 0): 2, (False, 1): 2}


def test_a_wall_clock_median_is_marked_in_the_report():
    t = Timing(median_us=500.0, p10_us=490.0, p90_us=520.0, reps=20, bound="wall", events_median_us=400.0,
               wall_median_us=500.0)
    assert report._spread(t) == "500.0 (wall; events 400.0) (490-520)"
    assert report._us(Timing(median_us=400.0, bound="events")) == "400.0"


def test_a_host_bound_kernel_is_marked_with_its_host_time():
    t = gpu.honest_timing([480.0, 483.0, 490.0], [479.0, 481.0], hosts_us=[450.0, 470.0, 700.0])
    assert t.host_median_us == 470.0 and t.host_bound and t.bound == "events"
    assert report._spread(t) == "483.0 (481-489); host-bound: forward() 470 on the host"
    gpu_bound = gpu.honest_timing([480.0, 483.0, 490.0], [479.0, 481.0], hosts_us=[60.0, 70.0, 80.0])
    assert (gpu_bound.host_median_us == 70.0 and not gpu_bound.host_bound
            and report._spread(gpu_bound) == "483.0 (481-489)")


def test_each_round_keeps_its_batch_time_by_the_clock_that_set_the_median():
    events = gpu.honest_timing([400.0, 402.0, 420.0, 424.0], [405.0, 425.0], batch_medians_us=[401.0, 422.0])
    assert events.bound == "events" and events.rounds_us == [401.0, 422.0]
    wall = gpu.honest_timing([1.0, 1.0, 1.2, 1.1], [400.0, 410.0], batch_medians_us=[1.0, 1.15])
    assert wall.bound == "wall" and wall.rounds_us == [400.0, 410.0]


def test_ratios_pair_the_rounds_so_a_clock_burst_hits_both_sides():
    """Two equal kernels under a 10% power-cap burst that began between their batches in round 3: each median
    falls on another side of the burst, the round-by-round ratio does not."""
    from coda_agent.measure.timing import paired_ratio

    kernel = Timing(median_us=110.0, rounds_us=[100.0, 110.0, 110.0, 110.0, 100.0])
    cublas = Timing(median_us=100.0, rounds_us=[100.0, 110.0, 100.0, 110.0, 100.0])
    assert cublas.median_us / kernel.median_us == pytest.approx(0.909, abs=1e-3)
    assert paired_ratio(cublas, kernel) == 1.0
    row = _row().model_copy(update={"candidate": kernel, "cublas": cublas})
    assert row.ratio("cublas") == 1.0
    # no rounds (results from before they were kept), or rounds of another run: the ratio of the medians
    assert paired_ratio(Timing(median_us=100.0), kernel) == pytest.approx(100 / 110)
    assert paired_ratio(Timing(median_us=100.0, rounds_us=[100.0, 100.0]), kernel) == pytest.approx(100 / 110)


def test_targets_compare_each_sides_fastest_round_where_two_clock_modes_swing_the_paired_median():
    """The LM heads' rounds on the H200: each side in one of two modes ~10% apart, round by round and
    independently (bench/results/h200-2026-12-03-c.json, gemm_rmsnorm_cross_entropy_bwd at coda-h4096,
    rounded). The paired median follows the middle round's modes; each side's fastest round is the same kernel
    at the same clock."""
    from coda_agent.measure.timing import fastest_round_ratio

    kernel = Timing(median_us=5659.0,
                    rounds_us=[5388.0, 6141.0, 6049.0, 5512.0, 5619.0, 6216.0, 5659.0, 5731.0, 5396.0])
    cublas = Timing(median_us=5862.0,
                    rounds_us=[6095.0, 6095.0, 5843.0, 5400.0, 5416.0, 6099.0, 5862.0, 5413.0, 6131.0])
    assert fastest_round_ratio(cublas, kernel) == pytest.approx(5400 / 5388)
    row = _row(shape="coda-h4096", compiled=6100.0).model_copy(update={"candidate": kernel, "cublas": cublas})
    assert row.ratio("cublas") == pytest.approx(0.981, abs=1e-3)  # the table's paired median
    (check,) = report.target_checks(_run([row]))
    assert check.cublas_ratio == pytest.approx(1.002, abs=1e-3) and check.met
    assert "1.002x cuBLAS (need 0.97; paired 0.981x)" in check.describe()
    # a slower kernel stays slower at its fastest round: the target is not lowered
    slow = row.model_copy(
        update={"candidate": Timing(median_us=6200.0, rounds_us=[x * 1.1 for x in kernel.rounds_us])})
    (missed,) = report.target_checks(_run([slow]))
    assert missed.cublas_ratio == pytest.approx(5400 / 5388 / 1.1) and not missed.met
    # a ratio just short of its target never reads as meeting it
    block = _row(family="block", cublas=99.96, compiled=130.0)
    (short,) = report.target_checks(_run([block]))
    assert not short.met and "0.999x cuBLAS (need 1.0" in short.describe()
    # rows without rounds (older files) fall back to the ratio of the medians
    assert fastest_round_ratio(Timing(median_us=100.0), kernel) == pytest.approx(100 / 5659)
    # against compile: the mode whose fastest round is faster
    row.compiled_max_autotune = Timing(median_us=5000.0, rounds_us=[5600.0] * 9)
    row.compiled = Timing(median_us=6000.0, rounds_us=[5500.0] + [6100.0] * 8)
    assert row.fastest_ratio("better_compile") == pytest.approx(5500 / 5388)


def test_forged_event_times_are_raised_to_the_wall_clock():
    honest = gpu.honest_timing([400.0, 401.0, 399.0], [430.0, 436.0])  # within the slack: the events stand
    assert honest.median_us == 400.0 and honest.bound == "events"
    forged = gpu.honest_timing([1.0, 1.0, 1.2], [400.0, 410.0])
    assert forged.median_us == 405.0 and forged.bound == "wall" and forged.p90_us >= forged.median_us


def _row(task="t", shape="llama3-8b-down", family="forward", cand=100.0, cublas=98.0, compiled=110.0,
         correct=True):
    tm = lambda us: (None if us is None  # noqa: E731
                     else Timing(median_us=us, p10_us=us * 0.98, p90_us=us * 1.02, reps=20))
    return BenchRow(
        task=task, task_version=1, shape=shape, dims={"M": 1}, correct=correct,
        candidate=tm(cand) if correct else None, eager=tm(150.0), compiled=tm(compiled), cublas=tm(cublas),
        sol_us=80.0, flops=8e10, min_bytes=4e8, launches=2, family=family,
    )


def _run(rows):
    return BenchRun(
        created=datetime(2026, 11, 29, tzinfo=timezone.utc), command="coda-agent bench", device="NVIDIA H200",
        driver="580.1", packages={"torch": "2.11.0"}, git_commit="abc123", peak_tflops_bf16=800.0,
        peak_hbm_tbps=4.0, timing_method="events", correctness_seeds=3, rows=rows,
    )


def test_row_metrics_and_cells():
    r = _row()
    assert r.ratio("cublas") == pytest.approx(0.98) and r.pct_sol() == pytest.approx(80.0)
    assert r.tflops() == pytest.approx(800.0) and r.tbps() == pytest.approx(4.0)
    cells = report.row_cells(r)
    assert cells[:3] == ["llama3-8b-down", "yes", "2"] and cells[3] == "100.0 (98-102)"
    assert cells[-4:] == ["0.98", "80", "800", "4.00"]


def test_targets_apply_to_every_shape_and_hold_a_block_to_the_sum_of_its_gemms():
    run = _run([
        _row(),  # 0.98x cuBLAS, 1.1x compile: met
        _row(shape="coda-h4096", cublas=95.0),  # 0.95x cuBLAS: missed for a forward kernel
        # 0.99x the sum of its GEMMs: missed
        _row(task="blk", shape="coda-h4096", family="block", cublas=99.0),
        _row(task="blk", shape="ragged", family="block", cublas=100.0),  # at the sum of its GEMMs: met
        _row(shape="llama3-1b-down", cublas=50.0),  # a 1B shape counts too: missed
        _row(shape="coda-h2048", compiled=99.0),  # slower than compile: missed
    ])
    checks = report.target_checks(run)
    assert [c.met for c in checks] == [True, False, False, True, False, False]
    assert "x eager" in checks[2].describe() and "host-bound" not in checks[1].describe()
    host_bound = _row(shape="coda-h2048").model_copy(
        update={"candidate": Timing(median_us=400.0, host_median_us=390.0)})
    assert ("host-bound (390 µs of host time per call)"
            in report.target_checks(_run([host_bound]))[0].describe())
    # a row checked but not timed yet is neither met nor missed
    run.rows.append(_row(shape="llama3-8b-o").model_copy(update={"candidate": None, "pending": True}))
    assert len(report.target_checks(run)) == 6
    assert "2 of 6 rows meet both targets" in report.markdown_summary(run)
    assert "; 1 more rows are not timed yet." in report.markdown_summary(run)


def test_markdown_summary_has_provenance_tables_targets_and_failures():
    run = _run([_row(), _row(shape="ragged", correct=False)])
    run.rows[1].verdict_reason = "output 'h' has 3 NaN/Inf values\nmore"
    md = report.markdown_summary(run)
    for needle in ("# Bench: human kernels on NVIDIA H200 (2026-11-29)", "`coda-agent bench`", "driver 580.1",
                   "abc123", "800 TFLOP/s bf16, 4.00 TB/s", "## t (forward)", "| llama3-8b-down | yes | 2 |",
                   "## Targets", "1 of 2 rows meet", "## Failures",
                   "- t @ ragged: output 'h' has 3 NaN/Inf values"):
        assert needle in md, needle
    console = Console(record=True, width=200)
    console.print(report.task_table("t", run.rows))
    assert "NO" in console.export_text()


def test_results_round_trip_and_old_files_still_load():
    run = _run([_row()])
    again = BenchRun.model_validate_json(run.model_dump_json())
    assert again == run
    old = run.model_dump(mode="json")
    for key in ("peaks_method", "correctness_seeds"):
        old.pop(key)
    for key in ("family", "gemms"):
        old["rows"][0].pop(key)
    assert BenchRun.model_validate(old).rows[0].family == ""


def _verdict(stage: str, shapes: dict) -> Verdict:
    """A verdict as schema-1 run records stored it (per-shape results in ``details``; still read)."""
    return Verdict(task="gemm_residual_rmsnorm", task_version=1, backend="quack", outcome=Outcome.PASSED,
                   stages=[StageResult(stage=stage, outcome=Outcome.PASSED, details={"shapes": shapes})])


def test_rows_join_correctness_timings_and_speed_of_light():
    opts = runner.BenchOptions(shape_names=["llama3-8b-down", "ragged"])
    checked = _verdict("gpu_correctness", {
        "llama3-8b-down": {"outcome": "passed", "launches": 3},
        "ragged": {"outcome": "wrong_output", "reason": "output 'h': max error"},
    })
    t = {"median_us": 2000.0, "p10_us": 1990.0, "p90_us": 2010.0, "reps": 50}
    timed = _verdict("bench",
                     {"llama3-8b-down": {"dims": {"M": 8192}, "candidate": t, "eager": t, "compiled": t,
                                         "cublas": t}})
    assert timed.stage("bench").timings["llama3-8b-down"].compiled.median_us == 2000.0
    pending = runner.checked_rows(K0, opts, checked, PEAKS)
    assert [r.pending for r in pending] == [True, False]  # only a correct row waits for its time
    good, bad = runner.with_times(pending, timed)
    assert not good.pending and not bad.pending
    assert (good.correct and good.launches == 3 and good.candidate.median_us == 2000.0
            and good.gemms == [[8192, 4096, 14336]])
    assert good.sol_us == pytest.approx(2 * 8192 * 4096 * 14336 / 800e12 * 1e6)
    assert not bad.correct and bad.candidate is None and bad.verdict_reason == "output 'h': max error"


class _FakeBench:
    """The bench's two GPU phases replaced by verdicts made here: which tasks were checked and timed, and
    when."""

    def __init__(self, monkeypatch, stop_after: int | None = None, stop_checks_after: int | None = None):
        self.checked: list[str] = []
        self.timed: list[str] = []
        self.stop_after = stop_after
        self.stop_checks_after = stop_checks_after
        t = {"median_us": 100.0, "p10_us": 99.0, "p90_us": 101.0, "reps": 20}
        self.timing = {"candidate": t, "eager": t, "compiled": t, "cublas": t}
        monkeypatch.setattr(runner, "check_tasks", self.check)
        monkeypatch.setattr(runner, "time_task", self.time)

    def check(self, tasks, opts, progress, executor, on_checked):
        verdicts = {}
        for t in tasks:
            if len(self.checked) == self.stop_checks_after:
                raise KeyboardInterrupt  # the bench killed while this task was checked
            self.checked.append(t.name)
            verdicts[t.name] = _verdict("gpu_correctness", {"ragged": {"outcome": "passed", "launches": 1}})
            on_checked(t.name, verdicts[t.name])
        return verdicts

    def time(self, task, shapes, opts, progress, executor):
        done: Future = Future()
        if self.stop_after is not None and len(self.timed) == self.stop_after:
            done.set_exception(KeyboardInterrupt())  # the bench killed while this task was timed
        else:
            self.timed.append(task.name)
            done.set_result(_verdict("bench", {s: {"dims": {"M": 1}, **self.timing} for s in shapes}))
        return done


BENCH_TASKS = [find_task("gemm_residual_rmsnorm"), find_task("gemm_residual"), find_task("gemm_rmsnorm")]
RAGGED = runner.BenchOptions(shape_names=["ragged"])


def test_an_interrupted_bench_keeps_every_check_and_resume_only_times_the_rest(monkeypatch):
    saved: list[BenchRun] = []
    fake = _FakeBench(monkeypatch, stop_after=1)
    with pytest.raises(KeyboardInterrupt):
        runner.run_bench(BENCH_TASKS, RAGGED, PEAKS, "NVIDIA H200", "coda-agent bench", executor=None,
                         checkpoint=lambda r: saved.append(r.model_copy(deep=True)))
    first, last = saved[2], saved[-1]
    assert [r.pending for r in first.rows] == [True, True, True]  # written before any timing
    assert [(r.task, r.pending, r.candidate is not None) for r in last.rows] == [
        ("gemm_residual_rmsnorm", False, True), ("gemm_residual", True, False), ("gemm_rmsnorm", True, False)]
    assert (last.finished_tasks() == {"gemm_residual_rmsnorm"}
            and fake.checked == [t.name for t in BENCH_TASKS])
    assert "2 correct rows are not timed yet" in report.markdown_summary(last)
    assert report.row_cells(last.rows[1])[3] == "not timed yet"

    again = _FakeBench(monkeypatch)
    done = runner.run_bench(BENCH_TASKS, RAGGED, PEAKS, "NVIDIA H200", "coda-agent bench --resume",
                            executor=None, previous=BenchRun.model_validate_json(last.model_dump_json()))
    assert again.checked == [] and again.timed == ["gemm_residual", "gemm_rmsnorm"]  # their checks are kept
    assert ([r.task for r in done.rows] == [t.name for t in BENCH_TASKS]
            and not any(r.pending for r in done.rows))
    assert done.rows[0] == last.rows[0]  # kept as it was measured


def test_a_bench_stopped_while_checking_keeps_the_tasks_checked_so_far(monkeypatch):
    saved: list[BenchRun] = []
    fake = _FakeBench(monkeypatch, stop_checks_after=2)
    with pytest.raises(KeyboardInterrupt):
        runner.run_bench(BENCH_TASKS, RAGGED, PEAKS, "NVIDIA H200", "coda-agent bench", executor=None,
                         checkpoint=lambda r: saved.append(r.model_copy(deep=True)))
    assert [[(r.task, r.pending) for r in s.rows] for s in saved] == [
        [("gemm_residual_rmsnorm", True)], [("gemm_residual_rmsnorm", True), ("gemm_residual", True)]]
    assert fake.timed == [] and saved[-1].unchecked_tasks() == ["gemm_rmsnorm"]
    assert "Not checked yet, so not in the tables: gemm_rmsnorm" in report.markdown_summary(saved[-1])

    again = _FakeBench(monkeypatch)
    done = runner.run_bench(BENCH_TASKS, RAGGED, PEAKS, "NVIDIA H200", "coda-agent bench --resume",
                            executor=None, previous=BenchRun.model_validate_json(saved[-1].model_dump_json()))
    assert again.checked == ["gemm_rmsnorm"] and again.timed == [t.name for t in BENCH_TASKS]
    assert ([r.task for r in done.rows] == [t.name for t in BENCH_TASKS]
            and not any(r.pending for r in done.rows))


def test_resume_measures_again_what_changed_since(monkeypatch):
    fake = _FakeBench(monkeypatch)
    first = runner.run_bench(BENCH_TASKS[:2], RAGGED, PEAKS, "NVIDIA H200", "coda-agent bench", executor=None)
    first.rows[1].task_version += 1  # the task changed since: its rows cannot stand
    fake.checked.clear()
    runner.run_bench(BENCH_TASKS[:2], RAGGED, PEAKS, "NVIDIA H200", "coda-agent bench", executor=None,
                     previous=first)
    assert fake.checked == ["gemm_residual"]
    everything = runner.run_bench(BENCH_TASKS[:1],
                                  runner.BenchOptions(shape_names=["ragged", "llama3-8b-down"]), PEAKS,
                                  "NVIDIA H200", "x", executor=None, previous=first)
    assert fake.checked[-1] == "gemm_residual_rmsnorm" and len(everything.rows) == 2  # other shapes asked for


def test_resume_refuses_a_file_from_another_device_tree_or_seed_count(monkeypatch, tmp_path):
    from coda_agent.cli.bench_cmd import _previous_run
    from coda_agent.cli.core import UserError

    monkeypatch.setattr(runner, "git_commit", lambda: "abc123")
    default_only = runner.BenchOptions(compile_modes=("default",))
    run = _run([_row()])
    assert runner.resume_problem(run, "NVIDIA H200", default_only) is None
    assert ("measured on NVIDIA H200, this is NVIDIA H100"
            in runner.resume_problem(run, "NVIDIA H100", default_only))
    monkeypatch.setattr(runner, "git_commit", lambda: "def456")
    assert "commit abc123, this tree is def456" in runner.resume_problem(run, "NVIDIA H200", default_only)
    monkeypatch.setattr(runner, "git_commit", lambda: "abc123")
    assert ("3 seeds per shape, this run asks for 1"
            in runner.resume_problem(run, "NVIDIA H200",
                                     runner.BenchOptions(seeds=1, compile_modes=("default",))))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="not a bench results file"):
        _previous_run(bad, "NVIDIA H200", default_only)
    assert _previous_run(tmp_path / "absent.json", "NVIDIA H200", default_only) is None


def test_bench_progress_off_a_terminal_is_one_line_per_step(capsys):
    from coda_agent.cli.bench_cmd import _progress

    with _progress(3) as step:
        step("checked gemm_residual: passed")
    lines = capsys.readouterr().out.splitlines()
    assert (len(lines) == 2 and lines[0].endswith("] measuring peaks")
            and lines[1].endswith("] checked gemm_residual: passed"))
    assert lines[1].startswith("[") and " s] " in lines[1]


def test_environment_helpers():
    assert runner.device_slug("NVIDIA H200") == "h200"
    assert runner.device_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
    versions = provenance.package_versions()
    assert "torch" in versions and "coda-agent" in versions and "python" in versions
    commit = provenance.git_commit()
    assert commit is None or len(commit.removesuffix("-dirty")) == 40


def test_bench_without_a_gpu_says_so_in_one_line_and_exits_2_as_other_setup_errors(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, out, err = cli(capsys, "bench", "gemm_residual_rmsnorm")
    assert code == 2 and not out
    assert err.count("\n") == 1 and err.startswith("error: no CUDA GPU")
    assert "coda-agent verify TASK --backend torch" in err
    code, out, err = cli(capsys, "bench-e2e", "--preset", "1b")
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: no CUDA GPU"), err


def test_bench_rejects_unknown_shapes_before_looking_for_a_gpu():
    res = CliRunner().invoke(app, ["bench", "gemm_residual_rmsnorm", "--shape", "nope"])
    assert res.exit_code != 0 and "no selected task has bench shape(s) nope" in str(res.exception)


def test_bench_tune_is_the_verifiers_tune_stage_on_a_human_kernel_and_renders_a_diff_to_apply():
    task = find_task("gemm_residual")
    result = tune.tune_human_kernel(task, "small", ["tiny"], budget_s=2.0, stage="tune_cpu")
    (call,) = result.tuned.search["tiny"].calls
    assert call.epilogue == "add_residual" and len(call.tried_us) + len(call.failed) >= 1
    rows = tune.search_rows(result.tuned)
    assert rows[0][:3] == ["tiny", f"add_residual {'x'.join(map(str, call.mnk))}", "default"]
    assert (rows[0][3].startswith(f"{len(call.seconds)} configs")
            and (" s each" in rows[0][3]) == bool(call.seconds))
    assert len(rows[0]) == len(tune.SEARCH_COLUMNS)
    pinned = result.source.replace("def forward(",
                                   '@schedule({("add_residual", 1, 2, 3): Config(tile_n=208)})\ndef forward(')
    with_pin = tune.KernelTuning(task.name, result.source, Tuned(pinned, result.tuned.search))
    diff = with_pin.diff()
    assert diff.startswith("--- a/coda_agent/suite/human/gemm_residual.py") and "+@schedule({" in diff
    assert tune.KernelTuning(task.name, result.source, Tuned(None, {})).diff() == ""


def test_the_tune_table_names_only_what_the_diff_pins():
    """On an H100 (2026-12-06-c) the search's fastest at gemm_swiglu coda-h4096 lost the final
    comparison (3734.4 -> 3984.1 us, not pinned), and the table still named it the tuned config, beside a
    0.937 gain."""
    from coda_agent.primitives import Config

    def shape(before: float, after: float) -> ShapeTuning:
        return ShapeTuning(dims={}, before=Timing(median_us=before), after=Timing(median_us=after), calls=[
            TunedGemm(epilogue="gated", mnk=(16384, 22016, 4096), mode="acc_pair",
                      tuned=Config(tile_m=256, pingpong=False))])

    searched = Tuned(None, {"lost": shape(3734.4, 3984.1), "noise": shape(1000.0, 995.0),
                            "won": shape(1000.0, 950.0)},
                     cut_short={"cut": shape(1.0, 1.0).calls})
    won = {row[0]: row[4] for row in tune.search_rows(searched)}
    assert won["lost"] == won["noise"] == "as written (256x192 coop 2x1 not kept)"
    assert won["won"] == "256x192 coop 2x1"
    assert won["cut (cut short)"] == "as written (256x192 coop 2x1 not compared)"


def test_bench_tune_writes_its_provenance_and_the_shapes_a_dead_runner_lost(monkeypatch, tmp_path):
    task = find_task("gemm_residual")
    searched = tune.tune_human_kernel(task, "small", ["tiny"], budget_s=1.0, stage="tune_cpu")
    lost = {
        "ragged": "the runner died (restarted): terminate called after throwing an instance of "
                  "'std::bad_variant_access'"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(tune, "tune_human_kernel", lambda *a, **k: tune.KernelTuning(
        task.name, searched.source, Tuned(None, searched.tuned.search, lost)))
    out = tmp_path / "tune.json"
    res = CliRunner().invoke(app, ["bench", "gemm_residual", "--tune", "--json", str(out)],
                             terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "ragged: not tuned: the runner died (restarted)" in res.output
    report = json.loads(out.read_text())
    assert report["device"] == "NVIDIA H200" and report["packages"]["torch"] == torch.__version__
    assert report["command"].startswith("coda-agent") and "commit" in report  # the command line as run (argv)
    assert (report["tasks"]["gemm_residual"]["lost"] == lost
            and "tiny" in report["tasks"]["gemm_residual"]["shapes"])


def test_bench_tune_shows_and_writes_what_a_failed_search_measured_and_exits_nonzero(monkeypatch, tmp_path):
    task = find_task("gemm_residual")
    searched = tune.tune_human_kernel(task, "small", ["tiny"], budget_s=1.0, stage="tune_cpu")
    (call,) = searched.tuned.search["tiny"].calls
    killer = "crash: what():  std::bad_variant_access (no restart left)"
    cut = call.model_copy(update={"failed": {"128x192": killer}, "tuned": None})
    reason = "the runner died under config 128x192 with no restart left: what():  std::bad_variant_access"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(tune, "tune_human_kernel", lambda *a, **k: tune.KernelTuning(
        task.name, searched.source, Tuned(None, searched.tuned.search, {}, {"llama3-8b-down": [cut]},
              {"queued": 13, "built": 9, "failed": 2, "skipped": 2}), failed=reason))
    out = tmp_path / "tune.json"
    # the table whole on one line per row, whichever config the search kept
    monkeypatch.setenv("COLUMNS", "250")
    res = CliRunner().invoke(app, ["bench", "gemm_residual", "--tune", "--json", str(out)],
                             terminal_width=250)
    assert res.exit_code == 1, res.output
    shown = res.output.replace("\n", "")  # the console folds long lines at its width
    assert f"gemm_residual: the search failed: {reason}" in shown
    assert ("llama3-8b-down (cut short)" in shown
            and f"failed: llama3-8b-down add_residual: 128x192: {killer}" in shown)
    assert "nothing beat" not in shown and f"wrote {out}" in shown
    assert "builds for sm_90a on the CPU: 13 queued, 9 built, 2 failed, 2 skipped" in shown
    written = json.loads(out.read_text())["tasks"]["gemm_residual"]
    assert written["failed"] == reason and "tiny" in written["shapes"]
    assert written["cut_short"]["llama3-8b-down"][0]["failed"] == {"128x192": killer}
    assert written["builds"] == {"queued": 13, "built": 9, "failed": 2, "skipped": 2}


def test_the_targets_hold_a_kernel_to_the_faster_torch_compile():
    row = _row(compiled=110.0)
    row.compiled_max_autotune = Timing(median_us=95.0, reps=20)
    assert row.better_compile.median_us == 95.0 and row.ratio("better_compile") == pytest.approx(0.95)
    (check,) = report.target_checks(_run([row]))
    assert not check.met and "0.950x the better torch.compile" in check.describe()
    assert report.row_cells(row)[5:7] == ["110.0", "95.0"]
    assert _row(compiled=None).better_compile is None


def test_compiled_references_never_run_side_by_side(monkeypatch):
    """Inductor's compile sets torch.fx's process-wide tracing flag, which makes a compiled function entered
    from another thread raise: the checks' threads call (and so compile) their references one at a time."""
    import threading

    from coda_agent.measure import baselines

    inside, most = [0], [0]

    def fake_compile(fn, **_):
        def compiled(*args, **kwargs):
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            time.sleep(0.02)
            inside[0] -= 1

        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    refs = [baselines.compiled_reference(K0) for _ in range(4)]
    threads = [threading.Thread(target=lambda f=f: [f() for _ in range(3)]) for f in refs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1


def test_compile_baselines_follow_the_plans_modes():
    dims = K0.shape("small", "tiny")[0].dims
    inputs = K0.make_inputs(dims, 0, device="cpu")
    both = baseline_variants(K0, dims, inputs, device="cpu",
                             compile_modes=("default", "max-autotune-no-cudagraphs"))
    assert set(both) == {"eager", "compiled", "compiled_max_autotune", "cublas"}
    assert Plan().compile_modes == ["default", "max-autotune-no-cudagraphs"]
    with pytest.raises(ValueError, match=r"unknown torch\.compile mode"):
        Plan(compile_modes=["reduce-overhead"])
    run = _run([_row()])
    assert "compile modes default, this run asks for default, max-autotune" in runner.resume_problem(
        run.model_copy(update={"git_commit": provenance.git_commit()}), "NVIDIA H200", runner.BenchOptions())


def test_speed_of_light_says_which_ceiling_it_uses(monkeypatch):
    from coda_agent.agent import loop
    from coda_agent.agent.loop import AgentConfig, session_peaks

    (point, *_) = peaks.speed_of_light(K0, "bench", PEAKS)
    assert point.sol_us == pytest.approx(max(point.flops / 800e12, point.bytes / 4e12) * 1e6)
    assert PEAKS.label().startswith("measured on this GPU: 800 TFLOP/s")
    assert peaks.NOMINAL_H200.label().startswith("nominal, not measured: 989 TFLOP/s bf16, 4.80 TB/s")
    timed = AgentConfig(model="mock/x", plan=Plan(stages=["gpu_correctness", "profile"]))
    assert session_peaks(timed) is peaks.NOMINAL_H200  # no GPU here
    monkeypatch.setattr(loop, "gpu_verifier_available", lambda: True)
    monkeypatch.setattr(loop, "measure_peaks", lambda: PEAKS)
    assert session_peaks(timed) is PEAKS and session_peaks(AgentConfig(model="mock/x")) is peaks.NOMINAL_H200
