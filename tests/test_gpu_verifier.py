"""The GPU correctness stage's logic, on the CPU: kernel-trace rules, NaN poisoning, and the
candidate -> reference -> candidate protocol run with the torch emulator (the same code the GPU runs)."""

from __future__ import annotations

import pytest
import torch

from coda_agent.tasks import find_task
from coda_agent.verifier import gpu
from coda_agent.verifier.stages import Context
from coda_agent.verifier.verdict import Outcome

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
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8::Params)",
    "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn",
    "void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, float, 128, 16, 4, 4, false, false>(...)",
    "void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, false>(...)",
    "triton_tem_fused_addmm_0",
]
OTHERS = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4>)",
    "triton_per_fused_add_mul_pow_rsqrt_0",
]


@pytest.mark.parametrize("name", MATMULS)
def test_cublas_and_torch_matmul_kernels_are_recognised(name):
    assert gpu.classify_kernel(name) == "matmul"


def test_quack_kernels_are_recognised_even_with_gemm_in_the_epilogue_name():
    assert gpu.classify_kernel(QUACK) == "quack"
    assert gpu.classify_kernel(QUACK.replace("residual_rms", "my_gemm_epi")) == "quack"


@pytest.mark.parametrize("name", OTHERS)
def test_elementwise_and_reduction_kernels_are_other(name):
    assert gpu.classify_kernel(name) == "other"


def _trace(*kernels: tuple[str, int]) -> gpu.LaunchTrace:
    """A marker on stream 7, then the given (name, stream) kernels, as a Chrome trace the profiler would write."""
    events = [{"ph": "X", "cat": "kernel", "name": n, "args": {"stream": s, "correlation": 100 + i}} for i, (n, s) in enumerate(kernels, 1)]
    events.append({"ph": "X", "cat": "kernel", "name": OTHERS[0], "args": {"stream": 7, "correlation": 100}})
    events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "args": {"correlation": 101}})
    return gpu.LaunchTrace.from_events(gpu.kernels_from_chrome_trace({"traceEvents": events}))


def test_the_marker_names_the_stream_and_is_not_counted():
    t = _trace((QUACK, 7), (OTHERS[1], 7))
    assert t.main_stream == 7 and t.launches == 2
    assert t.problem(K0, "s") is None
    assert t.describe()["quack_kernels"] == 1


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


def test_an_empty_trace_is_a_harness_problem_not_the_candidate():
    with pytest.raises(RuntimeError, match="CUPTI"):
        gpu.LaunchTrace.from_events([])


def test_poisoned_allocations_fill_empty_with_nan_and_restore_the_mode():
    with gpu.poisoned_allocations():
        assert torch.isnan(torch.empty(64)).all()
        assert torch.isnan(torch.empty_like(torch.ones(3, 5, dtype=torch.bfloat16))).all()
        assert (torch.empty(4, dtype=torch.int32) == torch.iinfo(torch.int32).max).all()
    assert not torch.are_deterministic_algorithms_enabled()


# --- the protocol on the CPU emulator -----------------------------------------------------------------


def _check(source: str, seeds=(0, 1)) -> object:
    ctx = Context(task=K0, source=source, shape_set="small", shape_names=["tiny"], seeds=list(seeds))
    return gpu.run_correctness(ctx, device="cpu", backend_name="torch", trace=False)


def _candidate(name: str) -> str:
    return (CANDIDATES / name).read_text()


def test_the_human_kernel_passes_the_protocol():
    res = _check(K0.human_file.read_text())
    assert res.outcome is Outcome.PASSED, res.reason
    assert len(res.checks) == 2 * 3  # 2 seeds x 3 outputs
    assert res.details["shapes"]["tiny"]["outcome"] == "passed"


def test_a_partial_write_shows_up_as_nan():
    res = _check(_candidate("k0_partial_write.py"))
    assert res.outcome is Outcome.WRONG_OUTPUT
    assert "NaN/Inf" in res.reason and "unwritten element" in res.reason


def test_an_input_mutating_kernel_is_a_cheat():
    res = _check(_candidate("k0_mutates_input.py"))
    assert res.outcome is Outcome.CHEAT_DETECTED
    assert "modified its inputs ['residual']" in res.reason


def test_an_answer_cached_across_calls_is_a_cheat():
    res = _check(_candidate("k0_cached.py"))
    assert res.outcome is Outcome.CHEAT_DETECTED and "cached across calls" in res.reason


def test_a_copied_cached_answer_is_caught_on_the_next_seed():
    res = _check(_candidate("k0_cached_copy.py"))
    assert res.outcome is Outcome.CHEAT_DETECTED
    assert "seed 1" in res.reason and "previous inputs" in res.reason


def test_runs_that_disagree_beyond_tolerance_are_flagged_and_small_drift_is_noted():
    point = K0.shape("small", "tiny")[0]
    ok = gpu.OutputCheck(output="rstd", shape_point="tiny", seed=0, ok=True, max_abs_err=1e-3, allowed=1e-2)
    a = {"h": torch.ones(2), "normed": torch.ones(2), "rstd": torch.ones(2)}
    info: dict[str, object] = {}
    gpu._check_agreement(K0, a, {**a, "rstd": torch.ones(2) + 1e-3}, [ok], point, 0, info)
    assert info["not_bitwise_reproducible"] == ["rstd"]
    with pytest.raises(gpu._Reject, match=r"disagree on 'rstd' by 0\.5"):
        gpu._check_agreement(K0, a, {**a, "rstd": torch.ones(2) + 0.5}, [ok], point, 0, {})


def test_a_forward_that_raises_is_a_runtime_error_with_the_candidates_line():
    src = K0.human_file.read_text().replace("out = gemm(", "out = gemm(residual_rms, x, x, C=residual, gamma=gamma) or gemm(")
    res = _check(src)
    assert res.outcome is Outcome.RUNTIME_ERROR
    assert "forward() raised at shape tiny" in res.reason and "line " in res.reason
