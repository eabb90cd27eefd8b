"""``coda-agent bench-e2e``: the tiny stack on the CPU (emulator kernels, torch.compile through ``aot_eager``)
runs every variant, and the results, ratios and markdown carry everything the H200 run will; the CLI on a
machine without a GPU answers in one line."""

from __future__ import annotations

import hashlib
import json
import signal
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from coda_agent.bench import e2e
from coda_agent.bench.e2e import DEFAULT_VARIANTS, PRESETS, VARIANTS, run_e2e, step_plan
from coda_agent.bench.memory_peak import NO_FRAME, peak_live
from coda_agent.bench.report import e2e_markdown
from coda_agent.bench.results import (
    ATTENTION_KIND,
    CUDA_KERNELS,
    E2E_SUFFIX,
    FLOOR_MOONSHOT,
    NON_ATTENTION_GOAL,
    E2ERun,
    KernelFile,
    KernelKind,
)
from coda_agent.bench.runner import write_run
from coda_agent.cli import app
from coda_agent.store.index import Index
from coda_agent.tasks import find_task
from coda_agent.torch import CodaLlamaStack, ReferenceLlamaStack

from .conftest import invoke
from .records_factory import bench_row, make_bench

STEPS = 3
TOP = 40  # every op of the tiny step: on a busy CPU the ranking of the small ones varies
COMMAND = "coda-agent bench-e2e --preset tiny"


@pytest.fixture(scope="module")
def chosen(tmp_path_factory) -> Path:
    """A kernel file for the coda-kernels variant: the human gemm_swiglu_bwd, one comment apart (so its op is
    a different one)."""
    path = tmp_path_factory.mktemp("kernels") / "best.py"
    path.write_text(find_task("gemm_swiglu_bwd").human_file.read_text() + "\n# the chosen one\n")
    return path


@pytest.fixture(scope="module")
def run(chosen: Path) -> E2ERun:
    return run_e2e(PRESETS["tiny"], device="cpu", command=COMMAND, variants=list(VARIANTS),
                   plan=step_plan(1, STEPS), top=TOP, kernel_files={"gemm_swiglu_bwd": chosen})


def test_every_variant_is_timed_with_coda_first(run: E2ERun):
    assert [v.name for v in run.variants] == list(VARIANTS)
    for v in run.variants:
        assert v.step.reps == STEPS and v.step.p10_us is not None and v.step.p90_us is not None
        assert v.step.p10_us <= v.step.median_us <= v.step.p90_us
        assert v.tokens_per_s == pytest.approx(run.config.tokens / (v.step.median_us * 1e-6))
    assert run.attention.reps == STEPS


def test_the_non_attention_time_is_the_step_less_every_layers_attention(run: E2ERun):
    for v in run.variants:
        assert (v.non_attention_us
                == pytest.approx(v.step.median_us - run.config.layers * run.attention.median_us))
    assert f"{run.config.layers} layers x" in run.attention_method


def test_the_variants_run_the_same_model(run: E2ERun):
    """Same weights and batch: CODA's loss is the plain model's up to bf16 rounding; each model's compiled
    loss is its eager one."""
    losses = {v.name: v.loss for v in run.variants}
    assert losses["eager"] == pytest.approx(losses["coda"], rel=1e-2)
    assert (losses["compile"] == losses["compile-max-autotune"] == losses["compile-max-autotune-cublas"]
            == losses["eager"])
    assert losses["coda-compile"] == losses["coda-kernels"] == losses["coda"]


def test_the_compile_variants_say_how_they_ran_without_a_gpu(run: E2ERun):
    compiled = {v.name: (v.compile_backend, v.compile_mode) for v in run.variants if v.compile_backend}
    assert (compiled
            == {name: ("aot_eager", None) for name in ("coda-compile", "compile", "compile-max-autotune",
                                                       "compile-max-autotune-cublas")})
    assert run.variant("eager").compile_backend is None  # type: ignore[union-attr]
    assert any("aot_eager" in n for n in run.notes)


def test_memory_is_left_unmeasured_on_the_cpu(run: E2ERun):
    assert all(v.peak_memory_bytes is None and v.resident_bytes is None for v in run.variants)


def test_the_profile_names_the_chains_ops_for_coda_and_not_for_the_reference(run: E2ERun):
    for v in run.variants:
        assert 0 < len(v.top_kernels) <= TOP and v.kernels_measured.startswith("CPU ops")
        assert all(k.count > 0 and k.total_us > 0 for k in v.top_kernels)
        assert sum(k.total_us for k in v.top_kernels) <= v.kernel_total_us + 1e-6
        assert ([k.total_us for k in v.top_kernels]
                == sorted((k.total_us for k in v.top_kernels), reverse=True))
    assert any(k.name.startswith("coda::") for k in run.coda.top_kernels)
    assert not any(k.name.startswith("coda::")
                   for k in run.variant("eager").top_kernels)  # type: ignore[union-attr]


def test_the_kernels_variant_runs_the_files_it_is_given_and_records_them(run: E2ERun, chosen: Path):
    digest = hashlib.sha256(chosen.read_bytes()).hexdigest()
    op = f"coda::gemm_swiglu_bwd_{digest[:12]}"
    kernels = run.variant("coda-kernels")
    assert kernels is not None
    assert any(k.name.startswith(op) for k in kernels.top_kernels)
    assert not any(k.name.startswith(op) for k in run.coda.top_kernels)
    assert run.kernel_files == [KernelFile(task="gemm_swiglu_bwd", path=str(chosen), sha256=digest)]
    assert f"- coda-kernels: gemm_swiglu_bwd from `{chosen}` (sha256 {digest[:12]})" in e2e_markdown(run)


def test_kernel_files_add_their_variant_and_the_variant_needs_them(chosen: Path):
    run = run_e2e(PRESETS["tiny"], device="cpu", command="", variants=[], plan=step_plan(1, STEPS),
                  kernel_files={"gemm_swiglu_bwd": chosen})
    assert [v.name for v in run.variants] == ["coda", "coda-kernels"]
    with pytest.raises(ValueError, match="the coda-kernels variant runs the kernel files it is given, and "
                                         "none"):
        run_e2e(PRESETS["tiny"], device="cpu", command="", variants=["coda-kernels"])


def test_a_gradient_check_that_raises_costs_its_variant_a_note_not_the_run(monkeypatch):
    """QuACK refused one variant's gradient check on the GPU (a shape it could not take) after the timing: the
    run keeps every timing and the other variants' checks, and says why that one has none."""
    from coda_agent.bench import e2e

    real = e2e.gradient_check

    def check(stack, kernels, h, targets):
        if kernels.scaled_exp_chunk == 16384:
            raise ValueError("operand 'v': m == n makes row/col inference ambiguous\nmore")
        return real(stack, kernels, h, targets)

    monkeypatch.setattr(e2e, "gradient_check", check)
    run = run_e2e(PRESETS["tiny"], device="cpu", command="", variants=["coda-scaled-exp-16k"],
                  plan=step_plan(1, 1))
    assert [v.name for v in run.variants] == ["coda", "coda-scaled-exp-16k"]
    assert run.coda.gradients is not None and run.variant("coda-scaled-exp-16k").gradients is None
    assert all(v.step.median_us > 0 for v in run.variants)
    assert ("coda-scaled-exp-16k's gradients could not be checked: operand 'v': m == n makes row/col "
            "inference ambiguous") in run.notes


def test_max_autotune_is_refused_in_one_line_where_its_build_faults():
    """Inductor's max-autotune faulted building the 1B head's 4.2e9 logits on the GPU and took the process
    with it: the run refuses it up front there, before anything is built, and leaves it out by default."""
    assert "compile-max-autotune" not in DEFAULT_VARIANTS
    with pytest.raises(ValueError, match=r"compile-max-autotune cannot build this stack: .* at 4,202,692,608 "
                                         r"logits \(32,768 tokens x 128,256\)"):
        run_e2e(PRESETS["1b"], device="cuda", command="", variants=["compile-max-autotune"])


def test_max_autotune_with_cublas_gemms_is_the_mode_with_only_its_gemm_backends_changed(monkeypatch):
    """torch.compile takes a mode or options, not both: the variant that keeps max-autotune's GEMMs on cuBLAS
    (its Triton templates fault at the 1B head) passes the mode's own options, the GEMM backends narrowed, and
    its results name both."""
    seen: list[dict] = []
    monkeypatch.setattr(e2e.torch, "compile", lambda model, **kw: seen.append(kw) or model)
    model = torch.nn.Linear(2, 2)
    run, how = e2e.compiled_model(model, VARIANTS["compile-max-autotune-cublas"], "inductor")
    assert run is model and how == ("inductor", "max-autotune-no-cudagraphs, GEMM backends ATEN")
    assert seen == [{"backend": "inductor", "fullgraph": True,
                     "options": {"max_autotune": True, "coordinate_descent_tuning": True,
                                 "max_autotune_gemm_backends": "ATEN"}}]
    seen.clear()
    assert e2e.compiled_model(model, VARIANTS["compile-max-autotune"], "inductor")[1] == (
        "inductor", "max-autotune-no-cudagraphs")
    assert e2e.compiled_model(model, VARIANTS["compile-max-autotune-cublas"], "aot_eager")[1] == (
        "aot_eager", None)
    assert seen == [{"backend": "inductor", "mode": "max-autotune-no-cudagraphs", "fullgraph": True},
                    {"backend": "aot_eager", "fullgraph": True}]


def test_each_eager_coda_variants_gradients_are_checked_against_fp32_autograd(run: E2ERun):
    checked = {v.name: v.gradients for v in run.variants if v.gradients is not None}
    # compiled CODA runs the same kernels
    assert set(checked) == {"coda", "coda-kmajor", "coda-own-head", "coda-scaled-exp-16k", "coda-kernels"}
    for g in checked.values():
        assert g.passed and not g.failed and 0 <= g.worst_ratio <= 1 and g.tokens == 32
    md = e2e_markdown(run)
    assert ("- gradients of coda (one sequence of 32 tokens against FP32 autograd, the suite's tolerance "
            "rule): every one within its allowance; nearest, ") in md


def test_a_kernel_that_breaks_the_gradients_fails_the_check_by_name(tmp_path: Path):
    wrong = tmp_path / "wrong.py"
    wrong.write_text(find_task("gemm_swiglu_bwd").human_file.read_text().replace(  # type: ignore[union-attr]
        '{"dpreact": out["D"],', '{"dpreact": out["D"] * 1.03,'))
    run = run_e2e(PRESETS["tiny"], device="cpu", command="", variants=[], plan=step_plan(1, STEPS),
                  kernel_files={"gemm_swiglu_bwd": wrong})
    human, chosen = (run.variant(n).gradients for n in ("coda", "coda-kernels"))  # type: ignore[union-attr]
    assert human is not None and human.passed
    assert chosen is not None and not chosen.passed and "layers.1.w_gate_up" in chosen.failed
    assert chosen.worst_ratio > 1 and chosen.worst in chosen.failed
    assert "- gradients of coda-kernels (" in e2e_markdown(run) and "): FAILED, " in e2e_markdown(run)


def test_the_gradient_check_can_be_left_out():
    run = run_e2e(PRESETS["tiny"], device="cpu", command="", variants=[], plan=step_plan(1, STEPS),
                  gradients=False)
    assert run.coda.gradients is None and "gradients of" not in e2e_markdown(run)


def test_every_profiled_op_is_summed_by_kind(run: E2ERun):
    for v in run.variants:
        assert v.by_kind and sum(k.total_us for k in v.by_kind) == pytest.approx(v.kernel_total_us)
        assert [k.total_us for k in v.by_kind] == sorted((k.total_us for k in v.by_kind), reverse=True)
    kinds = {k.kind for k in run.coda.by_kind}
    assert {"task kernels (GEMM + epilogue)", "attention (SDPA)", "the chain's glue passes"} <= kinds
    assert "task kernels (GEMM + epilogue)" not in {k.kind for k in run.variant("eager").by_kind}  # type: ignore


@pytest.mark.parametrize(("name", "kind"), [
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", "attention (SDPA)"),
    ("void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*)", "attention (SDPA)"),
    ("kernel_cutlass_kernel_coda_agentprimitives_aheadGemmMod_rms_bwd", "task kernels (GEMM + epilogue)"),
    ("kernel_cutlass_kernel_quackepiloguefrontendGemmMod_norm_gated_da98", "task kernels (GEMM + epilogue)"),
    ("void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int)", "attention (SDPA)"),
    ("softmax_grad_in_place", "the chain's glue passes"),
    ("scale_cast_blocks", "the chain's glue passes"),
    ("rmsnorm_backward_rows", "the chain's glue passes"),
    ("_lce_glue_row", "the chain's glue passes"),
    ("coda::rms_begin", "the chain's glue passes"),
    ("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", "other GEMMs (cuBLAS, aten)"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "other GEMMs (cuBLAS, aten)"),
    ("triton_poi_fused_mul_silu_silu_backward_stack_view_2", "Inductor's Triton kernels"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", e2e.OTHER),
])
def test_a_kernel_is_named_for_what_it_is(name: str, kind: str):
    """Names from the kernel tables (bench/results/h200-2026-12-05-a-e2e-16.md, h100-2026-12-07-c-e2e-16.md).
    """
    assert e2e.kernel_kind(name) == kind


def test_the_timeline_counts_the_gpus_idle_time_between_kernels():
    """Overlapping kernels count once as busy; a gap ends with the next kernel to start."""
    kernels = [(0.0, 10.0, "a_gemm"), (2.0, 12.0, "softmax_grad_in_place"), (15.0, 20.0, "nvjet_x"),
               (40.0, 41.0, "GemmMod_rms_bwd"), (41.0, 45.0, "triton_poi_1")]
    t = e2e.gpu_timeline(kernels, longest=2)
    assert t is not None
    assert (t.span_us, t.busy_us, t.idle_us) == (45.0, 12.0 + 5.0 + 5.0, 23.0)
    assert [(g.us, g.before, g.after) for g in t.longest] == [(20.0, "nvjet_x", "GemmMod_rms_bwd"),
                                                              (3.0, "softmax_grad_in_place", "nvjet_x")]
    assert [(k.kind, k.count, k.total_us) for k in t.idle_by_next_kind] == [
        ("task kernels (GEMM + epilogue)", 1, 20.0), ("other GEMMs (cuBLAS, aten)", 1, 3.0)]
    assert e2e.gpu_timeline([]) is None


def test_the_markdown_shows_the_timeline_where_there_is_one(run: E2ERun):
    assert run.coda.timeline is None and "sat idle" not in e2e_markdown(run)  # the CPU step has no kernels
    timeline = e2e.gpu_timeline([(0.0, 1000.0, "GemmMod_a"), (3000.0, 4000.0, "nvjet_b")])
    coda = run.coda.model_copy(update={"timeline": timeline})
    md = e2e_markdown(run.model_copy(update={"variants": [coda, *run.variants[1:]]}))
    assert "The GPU sat idle 2.00 ms of the profiled step's 4.00 ms (50.0%), in 1 gap between" in md
    assert "| other GEMMs (cuBLAS, aten) | 1 | 2,000 |" in md and "| 2,000 | `GemmMod_a` | `nvjet_b` |" in md


def test_the_markdown_shows_what_the_step_held_at_its_memory_peak(run: E2ERun):
    assert run.coda.peak_breakdown is None and "memory peak" not in e2e_markdown(run)  # no GPU, no trace
    layer = {"filename": "/x/coda_agent/torch/layer.py", "line": 120, "name": "forward"}
    breakdown = peak_live([{"action": "alloc", "addr": 1, "size": 3 << 30, "frames": [layer]},
                           {"action": "alloc", "addr": 2, "size": 1 << 29, "frames": []}])
    coda = run.coda.model_copy(update={"peak_breakdown": breakdown})
    md = e2e_markdown(run.model_copy(update={"variants": [coda, *run.variants[1:]]}))
    assert "### coda: at its memory peak, 3.50 GiB allocated in the step" in md
    assert "| `coda_agent/torch/layer.py:120 (forward)` | 3.000 | 1 |" in md
    assert f"| `{NO_FRAME}` | 0.500 | 1 |" in md


def test_the_peak_step_starts_with_every_models_gradients_dropped():
    """Resident memory is the weights and the batch, whichever variant left its gradients behind."""
    models = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]
    for m in models:
        m(torch.ones(1, 2)).sum().backward()
    seen: list[bool] = []

    def step() -> torch.Tensor:
        seen.extend(p.grad is None for m in models for p in m.parameters())
        return torch.zeros(())

    loss, peak, resident = e2e.peak_memory(step, "cpu", models)
    assert seen == [True] * 4 and (peak, resident) == (None, None) and float(loss) == 0.0


def test_the_ratios_are_each_variants_time_over_codas(run: E2ERun):
    coda = run.coda
    assert set(run.speedups) == set(VARIANTS) - {"coda"}
    for name, ratio in run.speedups.items():
        v = run.variant(name)
        assert v is not None
        assert ratio["step"] == pytest.approx(v.step.median_us / coda.step.median_us)
        # On a busy CPU the tiny step's attention can outlast its share of the step: no ratio then, never a
        # negative one.
        if coda.non_attention_us > 0:
            assert ratio["non_attention"] == pytest.approx(v.non_attention_us / coda.non_attention_us)
        else:
            assert ratio["non_attention"] is None
    best = run.best_compile
    assert best is not None and best.name in ("compile", "compile-max-autotune",
                                              "compile-max-autotune-cublas")
    best_ratio = run.speedups[best.name]["non_attention"]
    assert run.non_attention_goal_met == (None if best_ratio is None else best_ratio >= NON_ATTENTION_GOAL)


def test_the_gemm_floor_runs_every_product_of_the_step_each_its_count_of_times(monkeypatch):
    """Per layer the four projections' forward, input and weight gradients, and the head's three: the floor
    runs exactly those products, in autograd's layouts."""
    config = PRESETS["tiny"]
    products = e2e.gemm_products(config)
    assert len(products) == 4 * 3 + 3 and sum(p.count for p in products) == 12 * config.layers + 3
    head = {p.name: (p.m, p.n, p.k, p.count) for p in products if p.name.startswith("head")}
    t, v, d = config.tokens, config.vocab, config.dim
    assert head == {"head forward": (t, v, d, 1), "head input gradient": (t, d, v, 1),
                    "head weight gradient": (v, d, t, 1)}
    ran: list[tuple[int, int, int]] = []
    mm = torch.mm

    def counted(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
        ran.append((a.shape[0], b.shape[1], a.shape[1]))
        assert out.shape == (a.shape[0], b.shape[1])
        return mm(a, b, out=out)

    step = e2e.gemm_floor_step(config, "cpu")
    monkeypatch.setattr(e2e.torch, "mm", counted)
    step()
    expected = sorted(mnk for p in products for mnk in [(p.m, p.n, p.k)] * p.count)
    assert sorted(ran) == expected


def test_the_floor_is_timed_with_the_steps_and_each_variant_stands_against_it(run: E2ERun):
    floor = run.gemm_floor
    assert floor is not None and floor.median_us > 0 and floor.reps >= STEPS
    assert run.gemm_products == e2e.gemm_products(run.config)
    for v in run.variants:
        assert run.over_floor(v) == pytest.approx(v.non_attention_us / floor.median_us)
    line = next(line for line in e2e_markdown(run).splitlines() if line.startswith("GEMM floor ("))
    assert f"{floor.median_us / 1e3:,.2f} ms" in line and f"coda {run.over_floor(run.coda):.3f}x" in line
    assert line.endswith(": met" if run.over_floor(run.coda) <= FLOOR_MOONSHOT else ": missed")


def test_sdpas_kernels_in_each_profiled_step_stand_beside_the_attention_timed_alone(run: E2ERun):
    """On a GPU the summary says how long SDPA's kernels took inside each step (at the power cap's clock)
    against the attention timed alone; a CPU profile counts ops, so it says nothing."""
    assert not any(line.startswith("- SDPA's kernels") for line in e2e_markdown(run).splitlines())
    on_gpu = run.model_copy(update={"variants": [
        v.model_copy(update={"kernels_measured": CUDA_KERNELS, "by_kind": [
            KernelKind(kind=ATTENTION_KIND, count=4, total_us=1000.0 * (i + 2)),
            KernelKind(kind="task kernels (GEMM + epilogue)", count=9, total_us=9000.0)]})
        for i, v in enumerate(run.variants)]})
    (line,) = [line for line in e2e_markdown(on_gpu).splitlines() if line.startswith("- SDPA's kernels")]
    alone = run.attention.median_us * run.config.layers / 1e3
    assert f"{run.variants[0].name} 2.00 ms, {run.variants[1].name} 3.00 ms" in line
    assert f"against {alone:,.2f} ms timed alone" in line


def test_the_json_round_trips_with_the_ratios_in_it(run: E2ERun, tmp_path: Path):
    json_path, md_path = tmp_path / "h200-e2e.json", tmp_path / "h200-e2e.md"
    assert write_run(run, json_path, md_path) == [json_path, md_path]
    data = json.loads(json_path.read_text())
    assert {"speedups", "non_attention_goal_met", "device", "driver", "packages", "git_commit", "created",
            "command"} <= set(data)
    assert E2ERun.model_validate_json(json_path.read_text()) == run
    assert md_path.read_text() == e2e_markdown(run)


def test_the_markdown_has_the_provenance_the_table_the_goal_and_the_kernels(run: E2ERun):
    md = e2e_markdown(run)
    assert f"- command: `{COMMAND}`" in md
    assert (f"git {run.git_commit or '?'}" in md and f"torch {torch.__version__}" in md
            and "- device: cpu" in md)
    assert "dim 64, ffn 96, 4/2 heads" in md and "2 x 32 = 64 tokens" in md
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| variant | model |")
    assert [row.split(" | ")[0].removeprefix("| ") for row in table[2:2 + len(VARIANTS)]] == list(VARIANTS)
    assert "| attention (2 x SDPA fwd+bwd) |" in md
    assert f"goal (>= {NON_ATTENTION_GOAL}x the better torch.compile on the non-attention time)" in md
    best = run.best_compile
    assert best is not None
    goal = next(line for line in md.splitlines() if line.startswith("goal ("))
    others = [v for v in run.variants if v.model == "CodaLlamaStack" and v.name != "coda"]
    for v in others:  # each other CODA variant against the same baseline, where its time is measurable
        shown = f"{v.name} {best.non_attention_us / v.non_attention_us:.3f}x" in goal
        assert shown == (v.non_attention_us > 0), v.name
    assert ("### coda: CPU ops" in md and f"The top {len(run.coda.top_kernels)}:" in md
            and f"### {best.name}: CPU ops" in md and "| task kernels (GEMM + epilogue) |" in md
            and "`coda::" in md)


def test_the_store_indexes_the_suite_bench_beside_it_and_not_the_e2e_file(run: E2ERun, tmp_path: Path):
    """The e2e file lives in the bench dir, which the leaderboard's index reads as suite bench runs."""
    runs, bench = tmp_path / "runs", tmp_path / "bench"
    suite = make_bench(bench, [bench_row("gemm_rmsnorm", "llama3-8b", 100.0)])
    write_run(run, bench / f"h200-2026-12-01{E2E_SUFFIX}.json", None)
    with Index.open(runs, bench) as ix:
        assert ix.rebuild().indexed == 1
        assert [r["path"] for r in ix.conn.execute("SELECT path FROM bench_runs")] == [str(suite)]
        assert ix.problems() == []


def out_of_memory_for(victim: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps of the eager reference (``victim="eager"``) or of CODA's stack (``"coda"``) raise CUDA's OOM."""
    real = e2e.training_step

    def step_for(model, run, h, targets):
        step = real(model, run, h, targets)
        is_coda, is_eager = (isinstance(model, CodaLlamaStack),
                             isinstance(model, ReferenceLlamaStack) and run is model)
        hit = is_coda if victim == "coda" else is_eager

        def oom() -> torch.Tensor:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB.\nmore detail")

        return oom if hit else step

    monkeypatch.setattr(e2e, "training_step", step_for)


def test_a_variant_out_of_memory_is_left_out_saying_why(monkeypatch):
    out_of_memory_for("eager", monkeypatch)
    run = run_e2e(PRESETS["tiny"], device="cpu", command="", variants=["eager", "compile"],
                  plan=step_plan(1, STEPS))
    assert [v.name for v in run.variants] == ["coda", "compile"]
    assert "eager was left out: out of memory: CUDA out of memory. Tried to allocate 16.00 GiB." in run.notes
    assert "- note: eager was left out" in e2e_markdown(run)


def test_coda_out_of_memory_stops_the_run_in_one_line(monkeypatch):
    out_of_memory_for("coda", monkeypatch)
    with pytest.raises(ValueError,
                       match=r"^the coda variant cannot run at this size \(out of memory: .*16.00 GiB\.\): "
                             r"try fewer"):
        run_e2e(PRESETS["tiny"], device="cpu", command="", variants=["eager"], plan=step_plan(1, STEPS))


def test_an_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="unknown variant"):
        run_e2e(PRESETS["tiny"], device="cpu", command="", variants=["fast"])


def test_the_cli_without_a_gpu_says_so_in_one_line(monkeypatch, capsys):
    """A setup error, as every other: one line on stderr, exit 2 (and where the CPU can still help)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert invoke("bench-e2e", "--preset", "1b") == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "no CUDA GPU" in captured.err and not captured.out
    assert "`--preset tiny` runs it on the CPU emulator" in captured.err


def test_a_run_cut_short_after_the_timing_keeps_what_it_measured(monkeypatch, capsys, tmp_path: Path):
    """Ctrl-C, or a timeout's SIGTERM (the CLI makes it one), while a variant is profiled: every variant keeps
    its timing, the variants measured before keep their measures, the files are written, the exit is 130, and
    SIGTERM's handler is given back."""
    handler = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    profiled = e2e.profile_kernels

    def interrupted_at_eager(step, device, top):
        if len(seen) == 1:  # the second variant: eager
            raise KeyboardInterrupt
        seen.append(1)
        return profiled(step, device, top)

    seen: list[int] = []
    monkeypatch.setattr(e2e, "profile_kernels", interrupted_at_eager)
    out = tmp_path / "e2e.json"
    assert invoke("bench-e2e", "--preset", "tiny", "--steps", "3", "--warmup", "1", "--variant", "eager",
                  "--json", str(out)) == 130
    run = E2ERun.model_validate_json(out.read_text())
    coda, eager = run.variants
    assert coda.top_kernels and coda.gradients is not None and coda.loss is not None
    assert eager.step.reps == 3 and eager.loss is not None  # its peak step ran; its profile did not
    assert not eager.top_kernels and eager.gradients is None
    assert any(n.startswith("cut short while measuring eager") for n in run.notes)
    assert "cut short" in capsys.readouterr().out and out.with_suffix(".md").exists()
    assert signal.getsignal(signal.SIGTERM) == handler


def test_the_tiny_preset_checks_a_kernel_files_gradients_on_the_cpu(monkeypatch, capsys, tmp_path: Path):
    """Without a GPU the tiny stack still runs, so a kernel that breaks the chain's gradients is caught before
    any GPU time: exit 1 and its name; nothing written to the bench folder unless asked."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CODA_AGENT_BENCH_DIR", str(tmp_path / "bench"))
    human = find_task("gemm_swiglu_bwd").human_file
    wrong = tmp_path / "wrong.py"
    wrong.write_text(human.read_text().replace(  # type: ignore[union-attr]
        '{"dpreact": out["D"],', '{"dpreact": out["D"] * 1.03,'))
    common = ("bench-e2e", "--preset", "tiny", "--steps", "3", "--warmup", "1", "--variant", "eager")
    assert invoke(*common, "--kernel", f"gemm_swiglu_bwd={wrong}") == 1
    out = capsys.readouterr().out
    assert "gradients of coda-kernels (" in out and "FAILED" in out and "layers.1.w_gate_up" in out
    assert "gradients of coda (" in out and not (tmp_path / "bench").exists()
    assert invoke(*common, "--kernel", f"gemm_swiglu_bwd={human}", "--json", str(tmp_path / "e2e.json")) == 0
    assert E2ERun.model_validate_json((tmp_path / "e2e.json").read_text()).device == "cpu"


def test_the_cli_refuses_an_unknown_preset_or_variant_before_looking_for_a_gpu():
    res = CliRunner().invoke(app, ["bench-e2e", "--preset", "70b"])
    assert res.exit_code != 0 and "no preset '70b' (known: 1b, 8b, tiny)" in str(res.exception)
    res = CliRunner().invoke(app, ["bench-e2e", "--variant", "fast"])
    assert res.exit_code != 0 and "no variant fast" in str(res.exception)


@pytest.mark.parametrize(("spec", "says"), [
    ("best.py", "--kernel takes TASK=FILE, got 'best.py'"),
    ("gemm_rope=best.py", "--kernel: gemm_rope is not a task of the Llama-3 chain (it runs "
                          "gemm_rmsnorm_rope,"),
    ("gemm_swiglu_bwd=missing.py", "--kernel: no file missing.py"),
    ("gemm_swiglu_bwd=empty.py", "--kernel: TypeError: empty.py: defines no forward(**inputs) for task "
                                 "gemm_swiglu_bwd"),
    ("gemm_swiglu_bwd=broken.py", "--kernel: SyntaxError: "),
])
def test_the_cli_refuses_a_wrong_kernel_file_in_one_line_before_looking_for_a_gpu(monkeypatch, capsys,
                                                                                   tmp_path: Path, spec: str,
                                                                                   says: str):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.py").write_text("x = 1\n")
    (tmp_path / "broken.py").write_text("def forward(:\n")
    looked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: looked.append(1) or False)
    assert invoke("bench-e2e", "--kernel", spec) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and not looked, err


def test_the_same_task_twice_is_refused(capsys, tmp_path: Path):
    human = str(find_task("gemm_swiglu_bwd").human_file)
    assert invoke("bench-e2e", "--kernel", f"gemm_swiglu_bwd={human}", "--kernel",
                  f"gemm_swiglu_bwd={human}") == 2
    assert "--kernel: gemm_swiglu_bwd is given twice" in capsys.readouterr().err


@pytest.mark.gpu
def test_one_1b_layer_on_the_gpu(tmp_path: Path):
    """The real shapes (dim 2048, batch 4 x 8192), one layer, a few steps; eager and the default compile
    only."""
    out = tmp_path / "e2e.json"
    res = CliRunner().invoke(app,
                             ["bench-e2e", "--preset", "1b", "--layers", "1", "--steps", "3", "--warmup", "2",
                                   "--variant", "eager", "--variant", "compile", "--json", str(out)])
    assert res.exit_code == 0, res.output
    run = E2ERun.model_validate_json(out.read_text())
    assert [v.name for v in run.variants] == ["coda", "eager", "compile"]
    assert run.config.layers == 1 and run.config.tokens == 4 * 8192
    assert all(
        v.peak_memory_bytes and v.resident_bytes and v.peak_memory_bytes > v.resident_bytes
        for v in run.variants)
    assert all(v.kernels_measured == "CUDA kernels" and v.top_kernels for v in run.variants)
    for v in run.variants:  # the timeline and the peak's breakdown, from real traces
        assert v.timeline is not None and 0 < v.timeline.busy_us <= v.timeline.span_us
        assert v.peak_breakdown is not None and v.peak_breakdown.step_bytes > 0
        assert v.peak_breakdown.step_bytes <= v.peak_memory_bytes  # type: ignore[operator]
        assert v.energy is not None and v.energy.joules > 0 and v.energy.watts > 0 and v.energy.steps >= 2
    assert any("coda_agent/torch/" in s.where for s in run.coda.peak_breakdown.shares)  # type: ignore[union-attr]
    assert run.variant("eager").loss == pytest.approx(run.coda.loss, rel=1e-2)  # type: ignore[union-attr]
    assert run.coda.gradients is not None and run.coda.gradients.passed and run.coda.gradients.tokens == 2048
    assert out.with_suffix(".md").exists()
