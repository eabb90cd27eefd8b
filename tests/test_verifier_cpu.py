"""The CPU verifier: wrong candidates are rejected with the right outcome and an actionable reason."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from coda_agent.tasks import find_task
from coda_agent.verifier import Plan, stages, verify
from coda_agent.verifier.sandbox import Spec, runner_env
from coda_agent.verifier.verdict import Outcome

K0 = find_task("gemm_residual_rmsnorm")
CANDIDATES = Path(__file__).parent / "candidates"
HUMAN = K0.human_file.read_text()


def variant(old: str, new: str, source: str = HUMAN) -> str:
    assert old in source, f"{old!r} not in the human kernel"
    return source.replace(old, new)


def test_human_kernel_passes_with_a_full_error_table():
    v = verify(K0, HUMAN)
    assert v.outcome is Outcome.PASSED, v.reason
    worst = {c.output: c for c in v.worst_checks()}
    assert set(worst) == {"h", "normed", "rstd"}
    assert all(c.ok and c.max_abs_err is not None and c.max_abs_err <= c.allowed for c in worst.values())
    # 2 small shapes x (3 seeds + the stress set: its reference takes an rsqrt) x 3 outputs
    checks = v.stage("correctness").checks
    assert len(checks) == 24 and sum(c.stress for c in checks) == 6


def test_the_correctness_stage_records_where_its_time_went():
    correctness = verify(K0, HUMAN).stage("correctness")
    parts = correctness.seconds_by_part
    assert set(parts) == {"runner start", "inputs", "warm-up", "candidate", "transfer", "reference FP32",
                          "reference dtype", "checks", "discover", "runner stop"}
    assert all(v >= 0 for v in parts.values())
    assert sum(parts.values()) <= correctness.seconds + 0.01  # each rounded to the millisecond
    # the parts cover most of it: little is left as 'other'
    assert sum(parts.values()) >= 0.8 * correctness.seconds
    line = correctness.describe_time()
    assert (line.startswith(f"correctness {correctness.seconds:.2f} s: runner start ")
            or line.startswith(f"correctness {correctness.seconds:.1f} s: runner start "))
    assert "reference FP32" in line and "checks" in line


def test_the_stages_of_one_verification_share_a_runner_that_ends_with_it():
    """On the GPU, gpu_correctness and profile run in one runner: the candidate's kernels are built and loaded
    once. A stage's fault ends its runner, and the runner exits by itself when told to."""
    ctx = stages.Context(task=K0, source=HUMAN, plan=Plan(), deadline=time.monotonic() + 120)
    point = K0.shape("small")[0]
    with ctx.runner("torch", "cpu", shared=True) as first:
        first.put("s", K0.make_inputs(point.dims, 0))
        first.run(["s"], keep=[])
        first.drop(["s"])
    assert ctx.kept == {("torch", "cpu"): first} and first.proc.poll() is None
    assert "runner start" in ctx.watch.parts and "runner stop" not in ctx.watch.parts
    ctx.watch = stages.Stopwatch()
    with ctx.runner("torch", "cpu", shared=True) as second:
        assert second is first
    assert set(ctx.watch.parts) == {"runner reset"}
    with pytest.raises(RuntimeError), ctx.runner("torch", "cpu", shared=True) as third:
        assert third is first
        raise RuntimeError("the stage failed")
    assert ctx.kept == {} and first.proc.returncode == 0  # told to exit, it did: not killed
    with ctx.runner("torch", "cpu", shared=True) as fourth:
        assert fourth is not first
    ctx.close_runners()
    assert ctx.kept == {} and fourth.proc.returncode == 0
    with ctx.runner("torch", "cpu") as alone:  # not shared: it ends with its stage
        pass
    assert ctx.kept == {} and alone.proc.returncode == 0


def test_a_runner_kept_past_the_last_stage_is_stopped_inside_that_stage_s_time(monkeypatch):
    """On the GPU the runner the stages share ends after the last stage (its exit frees the device memory it
    held, seconds at an LM head): that time counts in the last stage, so the stages add up to the wall."""

    def keeps_a_runner(ctx: stages.Context) -> stages.StageResult:
        with ctx.runner("torch", "cpu", shared=True):
            pass
        return stages.StageResult(stage="kept", outcome=Outcome.PASSED, reason="")

    monkeypatch.setitem(stages.STAGES, "kept", stages.timed_by_part(keeps_a_runner))
    v = verify(K0, HUMAN, Plan(stages=["kept"]))
    kept = v.stage("kept")
    assert v.outcome is Outcome.PASSED and set(kept.seconds_by_part) == {"runner start", "runner stop"}
    assert kept.seconds >= sum(kept.seconds_by_part.values()) - 0.01
    assert abs(sum(s.seconds for s in v.stages) - v.timings["wall_s"]) < 0.1


def test_wrong_sign_is_wrong_output_naming_the_output_and_location():
    v = verify(K0, variant("h = acc + c", "h = acc - c"))
    assert v.outcome is Outcome.WRONG_OUTPUT
    assert "output 'h'" in v.reason and "exceeds the allowed" in v.reason
    bad = [c for c in v.worst_checks() if not c.ok]
    assert {c.output for c in bad} == {"h", "normed", "rstd"}
    assert all(c.worst_index is not None for c in bad)


def test_a_logsumexp_without_the_max_subtraction_passes_the_seeds_and_fails_the_stress_set():
    """exp of the raw logits is right while they are small, as the seeds draw them, and Inf past 88: the
    stress set (x at large magnitudes, where the FP32 reference is finite) turns that into a rejection an LLM
    can act on."""
    ce = find_task("gemm_cross_entropy")
    v = verify(ce, (CANDIDATES / "ce_unshifted_logsumexp.py").read_text())
    assert v.outcome is Outcome.WRONG_OUTPUT
    assert v.reason.startswith("on the stress inputs at shape tiny (x at large magnitudes"), v.reason
    assert ("output 'lse' has 256 NaN/Inf values" in v.reason
            and "over a row, subtract its maximum before exp" in v.reason)
    # and what an element-wise overflow wants (a manual seat's exp(x)/(1+exp(x)) gate was told of a row max)
    assert "element-wise, use the value functions that saturate (sigmoid, silu, tanh)" in v.reason
    checks = v.stage("correctness").checks
    seeds = [c for c in checks if not c.stress]
    assert len(seeds) == 9 and all(c.ok for c in seeds)  # tiny's 3 seeds x 3 outputs, then the stress set
    assert [c.input_set for c in checks if not c.ok] == ["tiny/stress"] * 2  # lse, and the loss taken from it
    human = verify(ce, ce.human_file.read_text())  # the online (max, sum) logsumexp
    assert human.outcome is Outcome.PASSED and "and the stress set" in human.reason


def test_a_forward_that_raises_on_the_stress_inputs_alone_is_told_so():
    """The stress set runs first (the warm-up call): a model read "raised at shape tiny" as its ordinary
    inputs (found from the manual seat)."""
    v = verify(K0, variant("    out = gemm(residual_rms", "    assert x.abs().amax() < 20, 'large x'\n"
                                                        "    out = gemm(residual_rms"))
    assert v.outcome is Outcome.RUNTIME_ERROR
    assert "raised at shape tiny {'M': 256, 'N': 384, 'K': 128} on the stress inputs alone (residual, x" \
        in v.reason, v.reason
    plain = verify(K0, variant("    out = gemm(residual_rms", "    assert x.abs().amax() < 0, 'any x'\n"
                                                            "    out = gemm(residual_rms"))
    assert "raised at shape tiny {'M': 256, 'N': 384, 'K': 128}:\n" in plain.reason, plain.reason


def test_a_raw_exp_summed_across_the_row_is_refused_on_the_cpu_for_the_gpus_padding():
    """The same logsumexp as a raw exp: at a partial last tile the GPU folds exp(0) = 1 for every padding
    column, so it is wrong at every vocabulary its tiles do not divide; the CPU stage says so in one line
    (the emulator has no tiles, and at tiny's 384 columns it would pass)."""
    src = (CANDIDATES / "ce_unshifted_logsumexp.py").read_text()
    src = src.replace('"sumexp": exp(acc) - 1.0', '"sumexp": exp(acc)').replace('+ w.shape[0]', '')
    v = verify(find_task("gemm_cross_entropy"), src)
    assert v.outcome is Outcome.RUNTIME_ERROR, v.reason
    assert "reduce 'sumexp' folds up to 1, not 0, where acc, c and the tile operands are 0" in v.reason, \
        v.reason
    assert "(RowVecLoad operands too; a ColVecLoad keeps its value" in v.reason  # a model misread that
    # a sum of exp is the LSE sink's (a manual seat took "a constant term on the host" literally: exp - 1)
    assert "a sum of exp over the row is OnlineLSEReduce's" in v.reason


def test_missing_output_is_named():
    v = verify(K0, variant('"normed": out["D"], ', ""))
    assert v.outcome is Outcome.WRONG_OUTPUT
    assert "output 'normed' is missing" in v.reason


def test_wrong_reduction_axis_is_caught_by_shape():
    src = variant("ColVecReduce(scaled=True)", "RowVecReduce(scaled=True)")
    src = variant("from coda_agent.primitives import ColVecReduce,",
                  "from coda_agent.primitives import RowVecReduce,", src)
    v = verify(K0, src)
    assert v.outcome is Outcome.WRONG_OUTPUT
    assert "output 'rstd' has shape" in v.reason


def test_partial_write_is_caught_where_it_happens():
    src = variant(
        'return {"h": out["h"],',
        'h = out["h"].clone()\n    h[h.shape[0] // 2 :] = 0\n    return {"h": h,',
    )
    v = verify(K0, src)
    assert v.outcome is Outcome.WRONG_OUTPUT
    (h,) = [c for c in v.worst_checks() if c.output == "h"]
    assert not h.ok and h.worst_index[0] >= 100  # the unwritten half of the rows


def test_an_input_counts_as_modified_bit_for_bit():
    """torch.equal calls -0.0 equal to 0.0, so sign bits written over an input's zeros (state across calls,
    a red-team pass) went unseen; a NaN never equals itself, so an input holding one read as modified."""
    from coda_agent.runner.serve import same_bits

    zeros = torch.zeros(4, 3)
    signed = zeros.clone()
    signed[1, 2] = -0.0
    assert torch.equal(zeros, signed) and not same_bits(zeros, signed)
    nan = torch.tensor([float("nan"), 1.0])
    assert same_bits(nan, nan.clone()) and same_bits(zeros.t(), zeros.clone().t())
    assert not same_bits(zeros, zeros.double()) and not same_bits(zeros, zeros.reshape(3, 4))


def test_input_mutation_is_a_cheat():
    src = variant("    out = gemm(", "    residual.zero_()\n    out = gemm(")
    v = verify(K0, src)
    assert v.outcome is Outcome.CHEAT_DETECTED
    assert "modified its inputs ['residual']" in v.reason


def test_runtime_error_points_at_the_candidates_line():
    src = variant("gamma=gamma)", "gamma=gamma, bogus=1.0)")
    v = verify(K0, src)
    assert v.outcome is Outcome.RUNTIME_ERROR
    line = next(i for i, text in enumerate(src.splitlines(), 1) if "bogus" in text)
    assert f"line {line}:" in v.reason and "unexpected operands bogus (not parameters" in v.reason


def test_static_rejection_never_starts_a_runner():
    v = verify(K0, HUMAN.replace("import", "import os\nimport", 1))
    assert v.outcome is Outcome.STATIC_REJECTED
    assert [s.stage for s in v.stages] == ["static"]


def test_endless_candidate_times_out():
    src = variant("    out = gemm(", "    while True:\n        pass\n    out = gemm(")
    v = verify(K0, src, Plan(timeout=8))
    assert v.outcome is Outcome.TIMEOUT
    assert "did not finish within 8 s" in v.reason


def test_runner_environment_is_an_allowlist_with_no_secrets(monkeypatch, tmp_path):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret")
    monkeypatch.setenv("RANDOM_SETTING", "x")
    env = runner_env(Spec(scratch=tmp_path, env={"QUACK_CACHE_DIR": "/tmp/q"}))
    assert "ANTHROPIC_API_KEY" not in env and "RANDOM_SETTING" not in env
    assert "sk-secret" not in "".join(env.values())
    assert (env["QUACK_CACHE_DIR"] == "/tmp/q" and env["PATH"] == os.environ["PATH"]
            and env["HOME"] == str(tmp_path))


def test_compile_error_reports_the_candidates_line():
    """Indexing a traced value (one element, not a tile) cannot compile; the reason points at the candidate's
    line."""
    src = variant("    h = acc + c\n", "    h = acc + c\n    h = h + h[0] * 0.0\n")
    v = verify(K0, src, Plan(stages=("compile",)))
    assert v.outcome is Outcome.COMPILE_ERROR, v.reason
    line = next(i for i, text in enumerate(src.splitlines(), 1) if "h[0]" in text)
    assert f"line {line}: h = h + h[0] * 0.0" in v.reason
    assert "building the sm_90a kernels failed" in v.reason
    assert "\x1b[" not in v.reason  # no terminal colour codes in a prompt


def test_the_compile_stage_builds_the_configs_forward_uses_at_the_bench_shapes():
    """Learnt from forward() on meta tensors at each bench shape: gemm_residual runs cooperative 128x256 at
    its long-K shapes (pinned at two, the default at a third) and 192x192 at the ragged one (pinned), configs
    the small shapes never ask for, so they are built here too."""
    task = find_task("gemm_residual")
    v = verify(task, task.human_file.read_text(), Plan(stages=("compile",), timeout=600))
    assert v.passed, v.reason
    assert (v.stage("compile").details["bench_configs"]
            == ["add_residual: 128x256 coop 2x1", "add_residual: 192x192 coop 2x1"])
    assert "and 2 more configs it uses at the bench shapes" in v.reason


def test_a_config_the_gpu_would_refuse_at_a_bench_shape_is_refused_by_the_emulators_stage():
    """The emulator's stage runs forward() at the bench shapes on meta tensors: a verify without the sm_90a
    compile (the CLI's default) refuses what the GPU would, with the lines of the module."""
    task = find_task("gemm_swiglu")
    pinned = task.human_file.read_text().replace("import epilogue,",
                                                 "import Config, epilogue, schedule,").replace(
        "def forward(", '@schedule({("gated", 8192, 28672, 4096): Config(tile_n=208)})\ndef forward(')
    v = verify(task, pinned, Plan(stages=("correctness",), timeout=600))
    assert v.stage("correctness").outcome is Outcome.RUNTIME_ERROR  # the small shapes never meet it
    assert "at bench shape llama3-8b-gateup" in v.reason and "on meta tensors" in v.reason
    assert "acc_pair mode with extra outputs needs tile_n % 32 == 0" in v.reason


def test_a_forward_that_raises_at_a_bench_shape_only_is_refused_on_the_cpu():
    """A model's forward() that only breaks at the bench shapes (there, M == N hid a vector's axis) passed
    the emulator's small shapes and failed on the GPU."""
    src = variant("def forward(x, w, residual, gamma, eps):\n",
                  "def forward(x, w, residual, gamma, eps):\n    if x.shape[0] > 4096:\n"
                  "        raise ValueError('too many rows')\n")
    v = verify(K0, src, Plan(stages=("correctness",), timeout=600))
    assert v.outcome is Outcome.RUNTIME_ERROR and "forward() raised at bench shape" in v.reason, v.reason
    assert "too many rows" in v.reason


def test_host_work_that_only_the_bench_shapes_get_is_held_to_the_launch_budget_on_the_cpu():
    src = variant('    return {"h": out["h"], "normed": out["D"], "rstd": rstd_from_sqsum(out["sqsum"], '
                  'w.shape[0], eps)}\n',
                  '    rstd = rstd_from_sqsum(out["sqsum"], w.shape[0], eps)\n'
                  '    if x.shape[0] > 4096:\n'
                  '        for _ in range(8):\n'
                  '            rstd = rstd * 1.0\n'
                  '    return {"h": out["h"], "normed": out["D"], "rstd": rstd}\n')
    v = verify(K0, src, Plan(stages=("correctness",), timeout=600))
    assert v.outcome is Outcome.OVER_LAUNCH_BUDGET and "(bench, on meta tensors)" in v.reason, v.reason


def test_host_ops_torch_spells_differently_on_the_cpu_are_not_other_work_at_the_bench_shapes():
    """``t[:0] = 1.0`` is one ``fill_`` on the CPU, a ``scalar_tensor`` and a ``copy_`` on meta tensors (and
    on a GPU): the bench shapes' work is compared with the small shape's on meta tensors too, so ordinary
    torch code is not called a cheat (a manual-seat model's kernel was)."""
    src = variant('    return {"h": out["h"], "normed": out["D"], "rstd": rstd_from_sqsum(out["sqsum"], '
                  'w.shape[0], eps)}\n',
                  '    rstd = rstd_from_sqsum(out["sqsum"], w.shape[0], eps)\n'
                  '    rstd[:0] = 1.0\n'
                  '    return {"h": out["h"], "normed": out["D"], "rstd": rstd}\n')
    roomy = K0.model_copy(update={"launch_budget": 6})  # the GPU's two kernels for it fit
    v = verify(roomy, src, Plan(stages=("correctness",), timeout=600))
    assert v.outcome is Outcome.PASSED and "bench shapes on meta tensors" in v.reason, v.reason


def test_a_forward_that_reads_values_on_the_host_is_refused_at_the_bench_shapes():
    """On meta tensors a value read raises: the CPU cannot judge the bench shapes of such a forward(), so a
    cheat that switches off the GEMM at large sizes only would pass unseen (it reads a value to opt out)."""
    src = variant("def forward(x, w, residual, gamma, eps):\n",
                  "def forward(x, w, residual, gamma, eps):\n    if bool(residual.abs().max() > 1e9):\n"
                  "        eps = eps * 2\n")
    v = verify(K0, src, Plan(stages=("compile",), timeout=600))  # the small shape compiles: real values
    # the small shape's meta run (what the bench shapes' work is compared with) meets it first
    assert v.outcome is Outcome.COMPILE_ERROR and "at shape tiny, run on meta tensors" in v.reason, v.reason
    assert "host code must work from shapes alone" in v.reason


# One task per family; each mutation is (old, new) text edits of the human kernel and the expected reason.
FAMILY_MUTATIONS = {
    "gemm_swiglu_bwd": [  # backward
        ("wrong sign", [("(2.0 + gate * (1.0 - sigmoid(gate)))", "(2.0 - gate * (1.0 - sigmoid(gate)))")],
         Outcome.WRONG_OUTPUT, "output 'zdz'"),
        ("missing output", [('"act": out["act"], ', "")], Outcome.WRONG_OUTPUT, "output 'act' is missing"),
        (
            "wrong reduction axis",
            [("ColVecReduce(scaled=True)", "RowVecReduce(scaled=True)"),
             ("import ColVecReduce,", "import RowVecReduce,")],
            Outcome.WRONG_OUTPUT,
            "output 'zdz' has shape",
        ),
        (
            "partial write",
            [('return {"dpreact": out["D"],',
              'd = out["D"].clone()\n    d[:, ::7] = 0\n    return {"dpreact": d,')],
            Outcome.WRONG_OUTPUT,
            "output 'dpreact'",
        ),
    ],
    "gemm_rmsnorm_bwd": [  # backward, row reduce
        ("wrong sign", [("xhat * (zdz * neg_inv_n)", "xhat * (zdz * -neg_inv_n)")], Outcome.WRONG_OUTPUT,
         "output 'dh'"),
        (
            "wrong reduction axis",
            [("RowVecReduce(scaled=True)", "ColVecReduce(scaled=True)"),
             ("RowVecReduce, epilogue", "ColVecReduce, epilogue")],
            Outcome.WRONG_OUTPUT,
            "output 'dgamma' has shape",
        ),
    ],
    "gemm_rmsnorm_cross_entropy_bwd": [  # backward, the LM head
        ("ignored rows counted", [("dloss * (targets != ignore_index)", "dloss")], Outcome.WRONG_OUTPUT,
         "output 'dlogits'"),
        ("one-hot off by one", [("d = column - target", "d = column - target - 1.0")], Outcome.WRONG_OUTPUT,
         "output 'dlogits'"),
    ],
    "gemm_rmsnorm_gemm": [  # block
        ("missing rstd", [("unpack(acc * rstd)", "unpack(acc)")], Outcome.WRONG_OUTPUT, "output 'act'"),
        ("wrong sign", [("h = acc + c", "h = acc - c")], Outcome.WRONG_OUTPUT, "output 'h'"),
        ("missing output", [(', "preact": second["D"]}', "}")], Outcome.WRONG_OUTPUT,
         "output 'preact' is missing"),
        ("unscaled preact", [('"D": pack(gate, up)', '"D": acc')], Outcome.WRONG_OUTPUT, "output 'preact'"),
        (
            "partial write",
            [('"act": second["act"]', '"act": torch.cat([second["act"][:100], second["act"][100:] * 0])')],
            Outcome.WRONG_OUTPUT,
            "output 'act'",
        ),
    ],
}
CASES = [(task, *case) for task, cases in FAMILY_MUTATIONS.items() for case in cases]


@pytest.mark.parametrize(("task_name", "label", "edits", "outcome", "reason"), CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_wrong_candidates_of_every_family_are_rejected(task_name, label, edits, outcome, reason):
    task = find_task(task_name)
    src = task.human_file.read_text()
    for old, new in edits:
        src = variant(old, new, src)
    v = verify(task, src)
    assert v.outcome is outcome, f"{label}: {v.outcome} {v.reason}"
    assert reason in v.reason, v.reason


def test_reasons_are_bounded_and_never_carry_a_secret_value(monkeypatch):
    from coda_agent.verifier import sanitize

    monkeypatch.setenv("OPENAI_API_KEY", "sk-FAKE-0123456789abcdef")
    text = sanitize("forward() raised: KeyError: 'sk-FAKE-0123456789abcdef'" + "x" * 10_000)
    assert "sk-FAKE-0123456789abcdef" not in text and "[redacted]" in text
    assert len(text) <= 2500


def test_the_reference_is_imported_once_per_source_not_per_shape_and_seed(tmp_path, monkeypatch):
    for path in (K0.path, K0.reference_file, K0.human_file):
        (tmp_path / path.relative_to(K0.path.parent)).parent.mkdir(exist_ok=True)
        shutil.copy(path, tmp_path / path.relative_to(K0.path.parent))
    task = find_task(str(tmp_path / K0.path.name))
    imports = []
    real = stages.reference_function
    monkeypatch.setattr(stages, "reference_function", lambda t: imports.append(t.name) or real(t))
    points = task.shape("small")
    for point in points:
        for seed in (0, 1):
            inputs = task.make_inputs(point.dims, seed)
            fp32, _ = stages.references(task, inputs)
            fresh = real(task)(**stages.upcast(inputs), **task.constants)
            assert all(torch.equal(fp32[o.name], fresh[o.name]) for o in task.outputs)
    assert len(points) > 1 and imports == [task.name]
    reference = tmp_path / K0.reference_file.name
    reference.write_text(reference.read_text() + "\n# edited\n")
    stages.references(task, task.make_inputs(points[0].dims, 0))
    assert imports == [task.name, task.name]  # an edited reference is imported afresh


def test_the_op_log_records_host_ops_with_their_largest_tensor_and_nothing_the_backend_runs():
    from coda_agent.primitives import ColVecLoad, backend, epilogue, gemm
    from coda_agent.runner.serve import OpLog

    @epilogue(operands={"s": ColVecLoad()})
    def scale(acc, s):
        return {"D": acc * s}

    log = OpLog()
    x, w, s = torch.randn(64, 32).bfloat16(), torch.randn(48, 32).bfloat16(), torch.rand(64)
    with torch.no_grad(), backend.using("torch", wrap=log.wrap_backend), log, log.call():
        parts = torch.cat([s, s, s])  # a Tensor[] argument: its largest tensor is the (192,) result
        # views are left out; the emulator's own ops are not host ops
        out = gemm(scale, x, w.t(), s=s.view(64))["D"]
        (out + 1).sum()
    ops = log.calls[-1]
    assert [op.get("op", "gemm") for op in ops] == ["aten::cat", "gemm", "aten::add.Tensor", "aten::sum"]
    assert ops[0]["numel"] == parts.numel() and ops[2]["numel"] == 64 * 48 and ops[3]["numel"] == 64 * 48
    assert ops[1]["gemm"] == [64, 48, 32] and ops[1]["epilogue"] == "scale"


def test_a_strided_vector_operand_counts_the_copy_the_gpu_backend_makes_of_it():
    """The QuACK backend copies a vector or tile operand that is not contiguous before the launch: one
    kernel the GPU's trace counts, so the CPU's estimate counts it too."""
    from coda_agent.primitives import ColVecLoad, backend, epilogue, gemm
    from coda_agent.runner.serve import OpLog
    from coda_agent.verifier.trace import LaunchEstimate

    @epilogue(operands={"s": ColVecLoad()})
    def scale(acc, s):
        return {"D": acc * s}

    log = OpLog()
    x, w, table = torch.randn(64, 32).bfloat16(), torch.randn(48, 32).bfloat16(), torch.rand(64, 3)
    with torch.no_grad(), backend.using("torch", wrap=log.wrap_backend), log:
        for s in (table[:, 0].contiguous(), table[:, 0]):  # a column of a wider tensor is strided
            with log.call():
                gemm(scale, x, w.t(), s=s)
    copied, strided = (LaunchEstimate.from_ops([o for o in ops if "gemm" in o]) for ops in log.calls)
    assert (copied.launches, strided.launches) == (1, 2)


def test_gemm_shapes_its_vector_operands_without_a_trip_through_the_op_log():
    """The (1, len) views gemm() makes of vector operands are not recorded by the op log, so they skip its
    Python dispatch (a trip per op, a large part of the runner's host time at short kernels); the candidate's
    own ops still go through it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from coda_agent.primitives import ColVecLoad, RowVecLoad, backend, epilogue, gemm

    class Seen(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.name())
            return func(*args, **(kwargs or {}))

    @epilogue(operands={"s": ColVecLoad(), "g": RowVecLoad()})
    def scaled(acc, s, g):
        return {"D": acc * s * g}

    x, w, s, g = (torch.randn(64, 32).bfloat16(), torch.randn(48, 32).bfloat16(), torch.rand(64),
                  torch.rand(48))
    results = {"D": torch.zeros(64, 48, dtype=torch.bfloat16)}
    seen = Seen()
    with backend.using("fake", run=lambda call: results), seen:
        gemm(scaled, x, w.t(), s=s, g=g)
    assert seen.ops == ["aten::t"]  # forward()'s own w.t(); none of gemm()'s


def test_a_gemm_reading_memory_no_op_wrote_is_refused_in_one_line():
    """torch.empty_like(residual) as C launches nothing, so a candidate that fed it to the GEMM at the bench
    sizes only ran the same kinds of work everywhere (a red-team pass); memory written first (out=, an
    in-place op, through a view) is fine."""
    garbage = variant("C=residual", "C=torch.empty_like(residual)")
    v = verify(K0, "import torch\n" + garbage)
    assert v.outcome is Outcome.RUNTIME_ERROR and "gemm() reads C from memory no op wrote" in v.reason
    for written in ("torch.empty_like(residual).copy_(residual)",  # (one launch more: over this budget)
                    "torch.add(residual, 0.0, out=torch.empty_like(residual))"):
        v = verify(K0, "import torch\n" + variant("C=residual", f"C={written}"))
        assert v.outcome in (Outcome.PASSED, Outcome.OVER_LAUNCH_BUDGET) and "no op wrote" not in v.reason
