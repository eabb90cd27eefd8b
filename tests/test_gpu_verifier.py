"""The checker's logic on the CPU: kernel-trace rules (on recorded traces), and the correctness protocol
run through a sandboxed runner with the torch emulator (the same code the GPU runs)."""

from __future__ import annotations

import time

import pytest
import torch

from coda_agent.tasks import find_task
from coda_agent.verifier import Plan, trace
from coda_agent.verifier.client import Batch, CallOutput
from coda_agent.verifier.stages import Context, Reject, agreement, call_problems, run_correctness
from coda_agent.verifier.verdict import Outcome, OutputCheck

from .conftest import REPO

K0 = find_task("gemm_residual_rmsnorm")
CANDIDATES = REPO / "tests" / "candidates"

# Kernel names as CUPTI reports them (QuACK's from a compiled K0; the others from cuBLAS/PyTorch traces).
QUACK = (
    "kernel_cutlass_kernel_quackepiloguefrontendGemmMod_residual_rms_d7a01764d8ee620d__c_row_sm9_object_at__"
    "TiledMMA_ThrLayoutVMNK1281111000_PermutationMNK____MMAAtom_ThrID1281_ShapeMNK6419216_0"
)
MATMULS = [
    "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cluster2x1x1_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>"
    "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8::Params)",
    "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn",
    "void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, float, 128, 16, 4, 4, false, "
    "false>(...)",
    "void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, "
    "false>(...)",
    "triton_tem_fused_addmm_0",
]
OTHERS = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, "
    "1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
    "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, "
    "float)#1}>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
    "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, "
    "float)#1}>, unsigned int, float, 4, 4>)",
    "triton_per_fused_add_mul_pow_rsqrt_0",
]


@pytest.mark.parametrize("name", MATMULS)
def test_cublas_and_torch_matmul_kernels_are_recognised(name):
    assert trace.classify_kernel(name) == "matmul"


def test_quack_kernels_are_recognised_even_with_gemm_in_the_epilogue_name():
    assert trace.classify_kernel(QUACK) == "quack"
    assert trace.classify_kernel(QUACK.replace("residual_rms", "my_gemm_epi")) == "quack"


def test_the_load_ahead_kernel_counts_as_a_fused_gemm_and_a_look_alike_does_not():
    # As the H200's profiler named it (bench/results/h200-2026-12-04-a-notes.md).
    ahead = ("kernel_cutlass_kernel_coda_agentprimitives_aheadGemmMod_add_residual_"
             "3b378895b50417fc__c_sm9_ahead_0")
    assert trace.classify_kernel(ahead) == "quack"
    assert trace.classify_kernel(ahead.replace("primitives_ahead", "my_gemm")) == "matmul"


@pytest.mark.parametrize("name", OTHERS)
def test_elementwise_and_reduction_kernels_are_other(name):
    assert trace.classify_kernel(name) == "other"


MARKER = "void at::cuda::(anonymous namespace)::spin_kernel(long)"
FLUSH = OTHERS[0]


def _chrome(*calls: list[tuple[str, int]]) -> dict:
    """A Chrome trace as the runner's profiler writes it: per call, marker and flush on stream 7, then the
    kernels."""
    events, order = [], 100
    for kernels in calls:
        for name, stream in [(MARKER, 7), (FLUSH, 7), *kernels]:
            events.append(
                {"ph": "X", "cat": "kernel", "name": name, "args": {"stream": stream, "correlation": order}})
            order += 1
    events.append(
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "args": {"correlation": 101}})
    return {"traceEvents": events}


def _trace(*kernels: tuple[str, int]) -> trace.LaunchTrace:
    (one,) = trace.calls_from_trace(_chrome(list(kernels)), 1)
    return one


def test_the_marker_and_flush_name_the_stream_and_are_not_counted():
    t = _trace((QUACK, 7), (OTHERS[1], 7))
    assert t.main_stream == 7 and t.launches == 2
    assert t.problem(K0, "s") is None
    assert t.describe()["quack_kernels"] == 1


def test_a_batch_trace_splits_into_calls_at_the_markers():
    chrome = _chrome([(QUACK, 7)], [(QUACK, 7), (OTHERS[1], 7)], [])
    calls = trace.calls_from_trace(chrome, 3)
    assert [c.launches for c in calls] == [1, 2, 0]
    lead_in = {"ph": "X", "cat": "kernel", "name": MARKER, "args": {"stream": 7, "correlation": 99}}
    with_lead_in = {"traceEvents": [lead_in, *chrome["traceEvents"]]}
    assert [c.launches for c in trace.calls_from_trace(with_lead_in, 3)] == [1, 2, 0]
    with pytest.raises(ValueError, match="CUPTI"):
        trace.calls_from_trace(_chrome([(QUACK, 7)]), 2)


def test_a_cublas_kernel_is_a_cheat_naming_the_kernel():
    outcome, reason = _trace((QUACK, 7), (MATMULS[0], 7)).problem(K0, "llama3-1b-down")
    assert outcome is Outcome.CHEAT_DETECTED
    assert "cuBLAS/torch matmul" in reason and "nvjet_tst" in reason and "llama3-1b-down" in reason


def test_work_on_a_side_stream_is_a_cheat():
    outcome, reason = _trace((QUACK, 13), (OTHERS[1], 7)).problem(K0, "s")
    assert outcome is Outcome.CHEAT_DETECTED and "side stream" in reason


def test_no_quack_gemm_is_a_cheat_when_the_task_has_gemms():
    outcome, reason = _trace((OTHERS[1], 7)).problem(K0, "s")
    assert outcome is Outcome.CHEAT_DETECTED and "primitives.gemm" in reason and "cache" in reason
    assert _trace((OTHERS[1], 7)).problem(K0.model_copy(update={"gemms": []}), "s") is None


def test_launches_over_budget_are_counted_and_listed():
    many = [(QUACK, 7)] + [(OTHERS[1], 7)] * K0.launch_budget
    outcome, reason = _trace(*many).problem(K0, "s")
    assert outcome is Outcome.OVER_LAUNCH_BUDGET
    assert f"launched {K0.launch_budget + 1} kernels, over the task's budget of {K0.launch_budget}" in reason


# --- the CPU's op log ---------------------------------------------------------------------------------

TINY = K0.shape("small", "tiny")[0]
GEMM = {"gemm": [TINY.dims["M"], TINY.dims["N"], TINY.dims["K"]], "sinks": ["ColVecReduce"],
        "mode": "element"}


def _estimate(*ops: dict) -> trace.LaunchEstimate:
    return trace.LaunchEstimate.from_ops(list(ops))


def test_the_estimate_counts_gemms_their_finalisation_and_host_ops():
    est = _estimate(GEMM, {"op": "aten::add.Tensor", "numel": 256}, {"op": "aten::empty_like", "numel": 10},
                    # an allocation launches nothing, overload or not
                    {"op": "aten::empty.memory_format", "numel": 10})
    assert est.launches == 3 and est.host_ops == ["aten::add.Tensor"]
    assert est.problem(K0, TINY.dims, "tiny") is None


def test_the_kinds_of_work_ignore_shapes_configs_and_allocations_but_not_epilogues_or_host_ops():
    """What the compile stage holds every bench shape's meta run to: the small shape's kinds of work."""
    small = [{**GEMM, "epilogue": "add_residual", "config": None}, {"op": "aten::add.Tensor", "numel": 256},
             {"op": "aten::empty_like", "numel": 10}]
    bench = [{**GEMM, "gemm": [8192, 4096, 14336], "epilogue": "add_residual", "config": {"tile_n": 256}},
             {"op": "aten::add.Tensor", "numel": 8192}]
    kinds = trace.LaunchEstimate.kinds
    assert kinds(small) == kinds(bench)
    assert kinds(small) != kinds([{**bench[0], "epilogue": "plain"}, bench[1]])
    assert kinds(small) != kinds([*bench, {"op": "aten::mul.Tensor", "numel": 8192}])
    assert kinds(small) != kinds([{**bench[0], "sinks": []}, bench[1]])


def test_a_gemm_that_bypasses_primitives_is_a_cheat_on_the_cpu():
    outcome, reason = _estimate({"op": "aten::mul.Tensor", "numel": 10}).problem(K0, TINY.dims, "tiny")
    assert outcome is Outcome.CHEAT_DETECTED and "ran as no primitives.gemm call" in reason
    small = {**GEMM, "gemm": [TINY.dims["M"], TINY.dims["N"], 1]}  # a trivial gemm, the real one elsewhere
    assert _estimate(small).problem(K0, TINY.dims, "tiny")[0] is Outcome.CHEAT_DETECTED


def test_the_task_gemms_rule_takes_a_transposed_or_k_split_call_and_names_a_folded_gemm():
    """One rule for the emulator's op log and the sm_90a build (a transposed call passed the one and was
    refused by the other); a refusal names the listed GEMM no call did (a LoRA's rank-16 up-projection folded
    into an epilogue, found from the manual seat)."""
    main, down, up = (256, 384, 128), (256, 16, 128), (256, 384, 16)
    assert trace.gemm_shortfall([main, down], [main, (16, 256, 128)]) == []
    assert trace.gemm_shortfall([main], [(256, 384, 64), (256, 384, 64)]) == []
    assert trace.gemm_shortfall([main, down, up], [(16, 256, 128), main]) == [up]
    assert trace.gemm_shortfall([main], [(256, 384, 1)]) == [main]
    reason = trace.gemm_shortfall_reason("tiny", [up], [(16, 256, 128), main])
    assert "GEMM (M, N, K) (256, 384, 16) ran as no primitives.gemm call" in reason
    assert "a gemm() call of its own" in reason and "(256, 384, 128)" in reason


def test_a_host_matmul_is_a_cheat_on_the_cpu_as_its_cublas_kernel_is_on_the_gpu():
    """Whatever spelling got it past the static check (``@=`` did once), aten::mm on the host is refused."""
    for op in ("aten::mm", "aten::addmm.default", "aten::convolution"):
        outcome, reason = _estimate(GEMM, {"op": op, "numel": 64}).problem(K0, TINY.dims, "tiny")
        assert outcome is Outcome.CHEAT_DETECTED and f"host code ran {op} outside primitives.gemm" in reason


def test_gemm_sized_host_work_is_a_cheat():
    m, n, k = GEMM["gemm"]
    outcome, reason = _estimate(GEMM, {"op": "aten::mul.Tensor", "numel": m * n * k}).problem(K0, TINY.dims,
                                                                                              "tiny")
    assert outcome is Outcome.CHEAT_DETECTED and "(aten::mul.Tensor) touched a tensor" in reason
    # the rule and what to do (a QK-norm's tail over q and k together was refused with neither: manual seat)
    assert "may have no more elements than the largest input or output" in reason
    assert "values in an epilogue" in reason


def test_the_cpu_holds_the_launch_budget():
    ops = [GEMM] + [{"op": "aten::add.Tensor", "numel": 8}] * K0.launch_budget
    outcome, reason = _estimate(*ops).problem(K0, TINY.dims, "tiny")
    assert outcome is Outcome.OVER_LAUNCH_BUDGET and "would launch about" in reason
    assert "move host-side glue into the epilogue" in reason
    assert _estimate(*ops).problem(K0, TINY.dims, "tiny", budget=False) is None
    # no host op to move: the advice is about the gemm calls and sinks (a LayerNorm backward's four sinks)
    sinks = {**GEMM, "sinks": ["ColVecReduce"] * K0.launch_budget}
    outcome, reason = _estimate(sinks).problem(K0, TINY.dims, "tiny")
    assert outcome is Outcome.OVER_LAUNCH_BUDGET and "host ops: none" in reason, reason
    assert "use fewer gemm calls or reduce sinks (each sink's finalisation is a launch)" in reason
    # an aten name nobody writes is said with what makes it (a 1-element operand's read: a manual seat's)
    read = [GEMM] + [{"op": "aten::_local_scalar_dense", "numel": 1}] * K0.launch_budget
    outcome, reason = _estimate(*read).problem(K0, TINY.dims, "tiny")
    assert "aten::_local_scalar_dense (a 1-element tensor read to the host: a 1-element operand" in reason


def test_calls_that_launch_different_work_are_a_cheat():
    ctx = Context(task=K0, source="", plan=Plan(), deadline=time.monotonic() + 60)
    same = [GEMM, {"op": "aten::add.Tensor", "numel": 8}]
    call_problems(ctx, Batch(times_us=[1.0, 1.0], wall_s=0.0, ops=[same, same]), TINY)
    cheap = [GEMM]
    with pytest.raises(Reject, match="launched different kernels"):
        call_problems(ctx, Batch(times_us=[1.0], wall_s=0.0, ops=[cheap]), TINY)


# --- the protocol on the CPU emulator, through the sandboxed runner --------------------------------------


def _check(source: str, seeds=(0, 1)) -> object:
    ctx = Context(task=K0, source=source, plan=Plan(shape_names=["tiny"], seeds=list(seeds)),
                  deadline=time.monotonic() + 120)
    return run_correctness(ctx, "gpu_correctness", "torch", "cpu")


def _candidate(name: str) -> str:
    return (CANDIDATES / name).read_text()


def test_the_human_kernel_passes_the_protocol():
    res = _check(K0.human_file.read_text())
    assert res.outcome is Outcome.PASSED, res.reason
    assert len(res.checks) == (2 + 1) * 3  # (2 seeds + the stress set) x 3 outputs
    assert res.details["shapes"]["tiny"]["outcome"] == "passed"
    assert res.details["shapes"]["tiny"]["launches"]["launches_estimate"] == 4


def test_a_partial_write_is_wrong_output():
    res = _check(_candidate("k0_partial_write.py"))
    assert res.outcome is Outcome.WRONG_OUTPUT, res.reason


def test_an_input_mutating_kernel_is_a_cheat():
    res = _check(_candidate("k0_mutates_input.py"))
    assert res.outcome is Outcome.CHEAT_DETECTED
    assert "modified its inputs ['residual']" in res.reason


@pytest.mark.parametrize("name", ["k0_cached.py", "k0_cached_copy.py"])
def test_a_module_level_cache_cannot_be_written_even_past_the_static_check(name):
    res = _check(_candidate(name))
    assert res.outcome is Outcome.RUNTIME_ERROR and "does not support item assignment" in res.reason


def test_runs_that_disagree_beyond_tolerance_are_flagged_and_small_drift_is_noted():
    ok = OutputCheck(output="rstd", shape_point="tiny", seed=0, ok=True, max_abs_err=1e-3, allowed=1e-2)
    a = {"h": torch.ones(2), "normed": torch.ones(2), "rstd": torch.ones(2)}

    def out(t: dict) -> CallOutput:
        return CallOutput(call=0, kind="dict", tensors=t, bad={}, storages={}, inputs_modified=[],
                          keys=list(t))

    info: dict[str, object] = {}
    agreement(K0, out(a), out({**a, "rstd": torch.ones(2) + 1e-3}), [ok], TINY, 0, info)
    assert info["not_bitwise_reproducible"] == ["rstd"]
    with pytest.raises(Reject, match=r"disagree on 'rstd' by 0\.5"):
        agreement(K0, out(a), out({**a, "rstd": torch.ones(2) + 0.5}), [ok], TINY, 0, {})


def test_a_forward_that_raises_is_a_runtime_error_with_the_candidates_line():
    src = K0.human_file.read_text().replace("out = gemm(",
                                            "out = gemm(residual_rms, x, x, C=residual, gamma=gamma) or "
                                            "gemm(")
    res = _check(src)
    assert res.outcome is Outcome.RUNTIME_ERROR
    assert "forward() raised at shape tiny" in res.reason and "line " in res.reason
