"""The chain's two fused passes (``coda_agent.torch.glue``) against the math written out plainly, and the
Triton kernels a GPU runs (under Triton's interpreter here) against both."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coda_agent.torch import glue, rope_table

IGNORE = -100


def lm_head_case(m: int = 40, v: int = 300, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(m, v, generator=g) * 3).to(torch.bfloat16)
    # the forward's FP32 lse, not the bf16 one's
    lse = torch.logsumexp(logits.float(), -1) + 0.01 * torch.randn(m, generator=g)
    targets = torch.randint(0, v, (m,), generator=g)
    targets[::7] = IGNORE
    dloss = torch.rand(m, generator=g) + 0.5
    return logits, lse, targets, dloss


def softmax_grad_by_hand(logits, lse, targets, dloss):
    z = logits.double()
    counted = targets != IGNORE
    onehot = torch.zeros_like(z)
    onehot[counted.nonzero()[:, 0], targets[counted]] = 1.0
    d = torch.where(counted, dloss.double(), 0.0)[:, None] * (torch.exp(z - lse.double()[:, None]) - onehot)
    return d, (d * z).sum(-1)


def test_the_softmax_gradient_overwrites_the_logits_and_returns_zdz():
    logits, lse, targets, dloss = lm_head_case()
    want_d, want_zdz = softmax_grad_by_hand(logits, lse, targets, dloss)
    kept = logits.clone()
    zdz = glue.softmax_grad_(kept, lse, targets, dloss, IGNORE)
    assert kept.dtype == torch.bfloat16 and zdz.dtype == torch.float32
    assert (kept.double() - want_d).abs().max() <= 2**-8 * want_d.abs().max()  # one bf16 rounding
    assert torch.allclose(zdz.double(), want_zdz, rtol=1e-5, atol=1e-5)


def test_ignored_rows_get_zero_dlogits_and_zero_zdz():
    logits, lse, targets, dloss = lm_head_case()
    kept = logits.clone()
    zdz = glue.softmax_grad_(kept, lse, targets, dloss, IGNORE)
    ignored = targets == IGNORE
    assert int(ignored.sum()) > 0
    assert torch.count_nonzero(kept[ignored]) == 0 and torch.count_nonzero(zdz[ignored]) == 0


def rope_case(batch: int = 2, seq: int = 12, n_q: int = 4, n_kv: int = 2, head_dim: int = 8, seed: int = 0):
    """SDPA-shaped gradients (B, heads, S, head_dim) in SDPA's usual layout (a transposed (B, S, heads, d))
    and one contiguous, the forward's qkv and the layer's table."""
    g = torch.Generator().manual_seed(seed)
    dq = torch.randn(batch, seq, n_q, head_dim, generator=g).transpose(1, 2)
    dk = torch.randn(batch, seq, n_kv, head_dim, generator=g).transpose(1, 2)
    dv = torch.randn(batch, n_kv, seq, head_dim, generator=g)
    qkv = torch.randn(batch * seq, (n_q + 2 * n_kv) * head_dim, generator=g).to(torch.bfloat16)
    return dq, dk, dv, qkv, rope_table(head_dim, n_q, n_kv, 500000.0)


def rope_backward_by_hand(dq, dk, dv, qkv, inv_freq):
    """Token-major dqkv (B*S, columns), every interleaved pair rotated by -position * inv_freq of its
    column."""
    batch, _, seq, _ = dq.shape
    dqkv = torch.cat([t.transpose(1, 2).reshape(batch * seq, -1) for t in (dq, dk, dv)], dim=-1).double()
    theta = torch.arange(seq).repeat(batch).double()[:, None] * inv_freq.double()[None, 0::2]
    y1, y2 = dqkv[:, 0::2], dqkv[:, 1::2]
    dz = torch.stack((y1 * theta.cos() + y2 * theta.sin(), y2 * theta.cos() - y1 * theta.sin()),
                     dim=-1).flatten(-2)
    return dz, (qkv.double() * dqkv).sum(-1)


def test_ropes_backward_reads_sdpas_layouts_and_rotates_every_pair_back():
    dq, dk, dv, qkv, inv_freq = rope_case()
    want_dz, want_zdz = rope_backward_by_hand(dq, dk, dv, qkv, inv_freq)
    dz, zdz = glue.rope_backward(dq, dk, dv, qkv, inv_freq)
    assert dz.shape == qkv.shape and dz.dtype == torch.bfloat16 and zdz.dtype == torch.float32
    assert torch.allclose(dz.double(), want_dz.to(torch.bfloat16).double(), rtol=1e-2, atol=1e-2)
    assert (dz.double() - want_dz).abs().max() <= 2 ** -8 * want_dz.abs().max()  # one bf16 rounding
    assert torch.allclose(zdz.double(), want_zdz, rtol=1e-5, atol=1e-4)


def test_the_v_columns_pass_through_unrotated():
    dq, dk, dv, qkv, inv_freq = rope_case()
    dz, _ = glue.rope_backward(dq, dk, dv, qkv, inv_freq)
    v_cols = dv.shape[1] * dv.shape[3]
    assert torch.equal(dz[:, -v_cols:], dv.transpose(1, 2).reshape(dz.shape[0], -1).to(torch.bfloat16))


def test_ropes_backward_is_a_custom_op_that_passes_opcheck():
    torch.library.opcheck(torch.ops.coda.rope_backward.default, rope_case())


TRITON_ON_THE_CPU = """
import sys, torch
sys.path.insert(0, {tests!r})
from test_torch_glue import IGNORE, lm_head_case, softmax_grad_by_hand
from coda_agent.torch import glue
logits, lse, targets, dloss = lm_head_case(m=24, v=1000)
want_d, want_zdz = softmax_grad_by_hand(logits, lse, targets, dloss)
kept = logits.clone()
zdz = glue.softmax_grad_triton(kept, lse, targets, dloss, IGNORE, block=256)
assert (kept.double() - want_d).abs().max() <= 2**-7 * want_d.abs().max(), "dlogits"
assert torch.allclose(zdz.double(), want_zdz, rtol=1e-5, atol=1e-5), "zdz"
assert glue.softmax_grad_triton(logits[:0], lse[:0], targets[:0], dloss[:0], IGNORE).shape == (0,)
print("ok")
"""

ROPE_TRITON_ON_THE_CPU = """
import sys, torch
sys.path.insert(0, {tests!r})
from test_torch_glue import rope_backward_by_hand, rope_case
from coda_agent.torch import glue
# SDPA's layouts (dq, dk a transposed (B, S, heads, d); dv contiguous), a last partial block of tokens
args = rope_case(batch=2, seq=21, n_q=4, n_kv=2, head_dim=16)
want_dz, want_zdz = rope_backward_by_hand(*args)
dz, zdz = glue.rope_backward_triton(*args, tokens=8)
assert dz.dtype == torch.bfloat16 and dz.shape == args[3].shape, "dz's form"
assert (dz.double() - want_dz).abs().max() <= 2**-7 * want_dz.abs().max(), "dz"
assert torch.allclose(zdz.double(), want_zdz, rtol=1e-5, atol=1e-4), "zdz"
eager_dz, eager_zdz = glue.rope_backward(*args)
assert (dz.double() - eager_dz.double()).abs().max() <= 2**-7 * want_dz.abs().max(), "dz against the eager op"
print("ok")
"""

NORM_TRITON_ON_THE_CPU = """
import torch
from coda_agent.torch import glue
g = torch.Generator().manual_seed(0)
h = (torch.randn(5, 40, generator=g) * 4).to(torch.bfloat16)  # a row shorter than its block
rstd = torch.rsqrt(h.float().pow(2).mean(-1) + 1e-5)
gamma = (torch.rand(40, generator=g) + 0.5).to(torch.bfloat16)
want = (h.double() * rstd.double()[:, None] * gamma.double())
out = glue.rms_normalize_triton(h, rstd, gamma)
assert out.dtype == torch.bfloat16 and out.shape == h.shape and out.is_contiguous(), "the output's form"
# within a bf16 step of the largest value (the interpreter's rounding to bf16 need not be the GPU's)
assert (out.double() - want).abs().max() <= 2**-7 * want.abs().max(), "values"
eager = glue.rms_normalize(h, rstd, gamma)
assert (out.double() - eager.double()).abs().max() <= 2**-7 * want.abs().max(), "against the eager op"
print("ok")
"""

NEW_GLUE_TRITON_ON_THE_CPU = """
import sys, torch
sys.path.insert(0, {tests!r})
from test_torch_glue import norm_case
from coda_agent.torch import glue
h, gamma, rstd, dy, scale = norm_case()
# the norm backward: several programs, the last one partial
dh, dgamma = glue.rmsnorm_backward_triton(h, gamma, rstd, dy, scale, rows_per_program=8)
want_dh, want_dgamma = glue.rmsnorm_backward(h.double(), gamma.double(), rstd.double(), dy.double(), scale)
assert dh.dtype == torch.bfloat16 and dh.shape == h.shape and dgamma.dtype == torch.float32, "their form"
assert (dh.double() - want_dh).abs().max() <= 2**-7 * want_dh.abs().max(), "dh"
assert torch.allclose(dgamma.double(), want_dgamma, rtol=1e-5, atol=1e-4), "dgamma"
# the scaled cast: a last partial block
x = torch.randn(1000) * 3
out = glue.scaled_cast_triton(x, scale, torch.bfloat16, block=256)
want = x.double() * 0.625  # within a bf16 step (the interpreter's rounding to bf16 need not be the GPU's)
assert out.dtype == torch.bfloat16 and ((out.double() - want).abs() <= 2**-7 * want.abs()).all(), "cast"
# the first norm's pass
normed, r = glue.rms_begin_triton(h.view(1, 37, 40), gamma, 1e-5)
assert normed.shape == (1, 37, 40) and r.shape == (1, 37) and r.dtype == torch.float32, "its form"
assert (normed.view(37, 40).double() - (h * gamma).double()).abs().max() <= 2**-7 * 16, "h * gamma"
assert torch.allclose(r.view(37), rstd, rtol=1e-5), "rstd"
print("ok")
"""


def under_tritons_interpreter(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a process of its own with ``TRITON_INTERPRET=1`` (the variable is read when a kernel is
    made), the tests folder on its path."""
    pytest.importorskip("triton")
    return subprocess.run([sys.executable, "-c", code.format(tests=str(Path(__file__).parent))],
                          env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
                          timeout=300)


def test_the_triton_softmax_gradient_runs_in_place_under_tritons_interpreter():
    """The kernel a GPU runs, executed on the CPU by Triton's interpreter, against the math written out: in
    place, several blocks per row, a last partial block, ignored rows."""
    done = under_tritons_interpreter(TRITON_ON_THE_CPU)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_the_triton_ropes_backward_reads_sdpas_layouts_under_tritons_interpreter():
    """The kernel a GPU runs, under Triton's interpreter, against the math written out and the eager op:
    gradients in SDPA's layouts, a last partial block of tokens, V unrotated, zdz summed over every head."""
    done = under_tritons_interpreter(ROPE_TRITON_ON_THE_CPU)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_the_triton_norm_pass_runs_under_tritons_interpreter():
    """The scaled-exp head's norm forward, under Triton's interpreter, against the math written out and the
    eager op: a row shorter than its block."""
    done = under_tritons_interpreter(NORM_TRITON_ON_THE_CPU)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_the_triton_norm_backward_scaled_cast_and_first_norm_run_under_tritons_interpreter():
    """The three passes around the scaled-exp head and the first layer, under Triton's interpreter, against
    the math: the norm backward's programs and partial dgamma rows, the scaled cast's last partial block."""
    done = under_tritons_interpreter(NEW_GLUE_TRITON_ON_THE_CPU)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_the_norm_backward_matches_autograd():
    """The element-wise norm backward's CPU math against autograd through the norm's forward, at the scaled
    gradient it is given (the loss's gradient rides in as a scale on dy)."""
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(6, 32, generator=g, dtype=torch.float64) * 3).requires_grad_()
    gamma = (torch.rand(32, generator=g, dtype=torch.float64) + 0.5).requires_grad_()
    dy = torch.randn(6, 32, generator=g, dtype=torch.float64)
    rstd = torch.rsqrt(h.pow(2).mean(-1) + 1e-5)
    (h * rstd[:, None] * gamma).backward(dy * 0.75)
    dh, dgamma = glue.rmsnorm_backward(h.detach(), gamma.detach(), rstd.detach(), dy, torch.tensor(0.75))
    assert torch.allclose(dh, h.grad) and torch.allclose(dgamma.double(), gamma.grad)


def norm_case(rows: int = 37, dim: int = 40, seed: int = 0):
    """A norm's saved input (bf16), weight, FP32 statistic, an incoming gradient and a loss gradient: rows
    that leave a last partial program, a row shorter than its block."""
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(rows, dim, generator=g) * 4).to(torch.bfloat16)
    gamma = (torch.rand(dim, generator=g) + 0.5).to(torch.bfloat16)
    rstd = torch.rsqrt(h.float().pow(2).mean(-1) + 1e-5)
    dy = torch.randn(rows, dim, generator=g).to(torch.bfloat16)
    return h, gamma, rstd, dy, torch.tensor(0.625)


def test_the_new_glue_ops_pass_opcheck():
    """The first norm's pass, the scaled norm backward and the scaled cast are custom ops a caller's
    torch.compile keeps whole: their fake kernels agree with the real ones."""
    h, gamma, rstd, dy, scale = norm_case()
    torch.library.opcheck(torch.ops.coda.rmsnorm_backward.default, (h, gamma, rstd, dy, scale))
    torch.library.opcheck(torch.ops.coda.scaled_cast.default, (dy.float(), scale, torch.bfloat16))
    torch.library.opcheck(torch.ops.coda.rms_begin.default, (h.view(1, 37, 40), gamma, 1e-5))


def test_the_first_norms_pass_gives_the_deferred_product_and_the_statistic():
    h, gamma, _, _, _ = norm_case()
    normed, rstd = glue.rms_begin(h.view(1, 37, 40), gamma, 1e-5)
    assert normed.shape == (1, 37, 40) and normed.dtype == torch.bfloat16 and rstd.shape == (1, 37)
    assert torch.equal(normed.view(37, 40), h * gamma)  # rounded once, as the product of two bf16 tensors
    want = 1 / (h.double().pow(2).mean(-1) + 1e-5).sqrt()
    assert torch.allclose(rstd.view(37).double(), want, rtol=1e-6)

#: Each Triton kernel's arguments not bf16 pointers or i32 (their types), its constexprs and warps, and its
#: integer arguments that a launch at the chain's sizes gives as multiples of 16 (Triton specializes on that,
#: as on 16-byte aligned pointers: it is what lets an access be a vector).
SM90_BUILDS = {
    "softmax_grad_in_place": ({"lse_ptr": "*fp32", "dloss_ptr": "*fp32", "zdz_ptr": "*fp32",
                               "targets_ptr": "*i64"}, {"BLOCK": glue.SOFTMAX_GRAD_BLOCK}, 8, {"row_stride"}),
    "rms_normalize_rows": ({"rstd_ptr": "*fp32"}, {"BLOCK": 2048}, 4, {"dim", "row_stride"}),
    "rms_begin_rows": ({"rstd_ptr": "*fp32", "eps": "fp32"}, {"BLOCK": 2048}, 4, {"dim", "row_stride"}),
    "scale_cast_blocks": ({"x_ptr": "*fp32", "scale_ptr": "*fp32"}, {"BLOCK": glue.SCALED_CAST_BLOCK}, 4,
                          {"n"}),
    "rmsnorm_backward_rows": ({"rstd_ptr": "*fp32", "scale_ptr": "*fp32", "dgamma_part_ptr": "*fp32"},
                              {"ROWS": glue.RMSNORM_BACKWARD_ROWS, "BLOCK": 2048}, 4,
                              {"dim", "h_row", "dy_row"}),
    "rope_backward_rows": ({"freq_ptr": "*fp32", "zdz_ptr": "*fp32"},
                           {"HEAD_DIM": 64, "TOKENS": glue.ROPE_BACKWARD_TOKENS}, 4,
                           {"q_b", "q_h", "q_s", "k_b", "k_h", "k_s", "v_b", "v_h", "v_s", "qkv_row",
                            "dz_row"}),
}


def sm90_ptx(name: str) -> str:
    """The PTX Triton builds for sm_90 from kernel ``name`` at the chain's sizes, down to the cubin (Triton's
    own ptxas, no GPU)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from coda_agent.torch import _glue_kernels

    kernel = getattr(_glue_kernels, name)
    pointers, constexprs, warps, aligned = SM90_BUILDS[name]
    signature = {p: "constexpr" if p in constexprs
                 else pointers.get(p, "*bf16" if p.endswith("_ptr") else "i32") for p in kernel.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(kernel.arg_names)
             if p in aligned or (p.endswith("_ptr") and p not in constexprs)}
    built = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    assert built.asm["cubin"].startswith(b"\x7fELF")
    return built.asm["ptx"]


@pytest.mark.parametrize("name", sorted(SM90_BUILDS))
def test_the_glue_kernels_build_for_sm90_on_the_cpu(name):
    """What the interpreter accepts, Triton's compiler must build for the H200: each kernel compiled for sm_90
    at the chain's sizes."""
    assert f".entry {name}" in sm90_ptx(name)


def test_ropes_backward_moves_its_bytes_in_16_byte_vectors():
    """The pass is bound by memory: its first version read and wrote each pair's lanes apart, 2 bytes an
    access, and took 2.2x Inductor's time on the H200 (bench/results/h200-2026-12-05-c-e2e.md). Every global
    access of the gradients, the saved outputs and dz is now a 16-byte vector."""
    ptx = sm90_ptx("rope_backward_rows")
    narrow = re.findall(r"\b(?:ld|st)\.global(?:\.\w+)*\.b16\b", ptx)
    assert not narrow, f"{len(narrow)} 2-byte global accesses"
    assert len(re.findall(r"\bld\.global(?:\.\w+)*\.v4\.b32\b", ptx)) >= 2
    assert re.search(r"\bst\.global(?:\.\w+)*\.v4\.b32\b", ptx)


@pytest.mark.parametrize("name", ["scale_cast_blocks", "rms_begin_rows", "rmsnorm_backward_rows"])
def test_the_passes_around_the_head_and_the_first_norm_move_16_byte_vectors(name):
    """These passes replace eager kernels that were slow for their bytes (the scaled cast took eager torch's
    unvectorized path): every global access of theirs is a 16-byte vector, none a 2-byte one."""
    ptx = sm90_ptx(name)
    assert not re.findall(r"\b(?:ld|st)\.global(?:\.\w+)*\.b16\b", ptx)
    assert re.search(r"\bld\.global(?:\.\w+)*\.v4\.b32\b", ptx)
    assert re.search(r"\bst\.global(?:\.\w+)*\.v4\.b32\b", ptx)


def gpu_kernels(fn, *args) -> list[str]:
    """The CUDA kernels one call of ``fn`` launches (after a first, compiling call)."""
    from torch.profiler import ProfilerActivity, profile

    fn(*(a.clone() for a in args))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.gpu
def test_on_the_gpu_the_softmax_gradient_is_one_kernel_equal_to_the_cpus():
    case = lm_head_case(m=512, v=32000)
    eager = case[0].clone()
    want = glue.softmax_grad_(eager, *case[1:], IGNORE).cuda()
    eager = eager.cuda()
    logits, lse, targets, dloss = (t.cuda() for t in case)
    kept = logits.clone()
    kernels = gpu_kernels(lambda *a: glue.softmax_grad_(*a, IGNORE), kept, lse, targets, dloss)
    assert kernels == ["softmax_grad_in_place"], kernels
    kept = logits.clone()
    got = glue.softmax_grad_(kept, lse, targets, dloss, IGNORE)
    worst = (kept.double() - eager.double()).abs().max()
    assert worst <= 2**-7 * eager.double().abs().max()  # the two exps differ by an ulp or so
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_on_the_gpu_ropes_backward_is_one_kernel_that_reads_sdpas_gradients_where_they_lie():
    """No transpose copy or concatenation before the pass: the pass's own kernel alone, equal to the CPU's."""
    cpu = rope_case(batch=2, seq=256, n_q=8, n_kv=2, head_dim=64)
    args = tuple(t.cuda() for t in cpu)
    assert gpu_kernels(glue.rope_backward, *args) == ["rope_backward_rows"]
    want_dz, want_zdz = glue.rope_backward(*cpu)
    dz, zdz = glue.rope_backward(*args)
    assert (dz.cpu().double() - want_dz.double()).abs().max() <= 2**-7 * want_dz.double().abs().max()
    assert torch.allclose(zdz.cpu(), want_zdz, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
def test_on_the_gpu_the_passes_around_the_head_and_the_first_norm_equal_the_cpus():
    """Each pass one Triton kernel (the norm backward with the sum of its dgamma partials), equal to the CPU's
    math within a bf16 step."""
    cpu = norm_case(rows=1000, dim=2048)
    h, gamma, rstd, dy, scale = (t.cuda() for t in cpu)
    kernels = gpu_kernels(glue.rmsnorm_backward, h, gamma, rstd, dy, scale)
    assert kernels[0] == "rmsnorm_backward_rows" and len(kernels) == 2, kernels  # and the partials' sum
    want_dh, want_dgamma = glue.rmsnorm_backward(*cpu)
    dh, dgamma = glue.rmsnorm_backward(h, gamma, rstd, dy, scale)
    assert (dh.cpu().double() - want_dh.double()).abs().max() <= 2**-7 * want_dh.double().abs().max()
    assert torch.allclose(dgamma.cpu(), want_dgamma, rtol=1e-4, atol=1e-3)
    x = torch.randn(3000, 700, device="cuda")
    assert gpu_kernels(lambda *a: glue.scaled_cast(*a, torch.bfloat16), x, scale) == ["scale_cast_blocks"]
    assert torch.equal(glue.scaled_cast(x, scale, torch.bfloat16), (x * 0.625).to(torch.bfloat16))
    assert gpu_kernels(lambda *a: glue.rms_begin(*a, 1e-5), h.view(2, 500, 2048), gamma) == ["rms_begin_rows"]
    normed, r = glue.rms_begin(h.view(2, 500, 2048), gamma, 1e-5)
    assert torch.equal(normed.view(1000, 2048), h * gamma)
    assert torch.allclose(r.view(1000), rstd, rtol=1e-5)
