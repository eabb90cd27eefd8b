"""The chain's two fused passes (``coda_agent.torch.glue``) against the math written out plainly, and the form
a GPU runs (Inductor's build of the same function) against the eager one."""

from __future__ import annotations

import os
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


@pytest.mark.slow
def test_inductors_build_of_ropes_backward_equals_the_eager_one():
    """A GPU runs RoPE's backward through Inductor; its CPU build of the same function must give what the
    eager form gives (~10 s: Inductor's C++ build)."""
    torch._dynamo.reset()
    args = rope_case()
    fn = glue.rope_backward.__wrapped__  # type: ignore[attr-defined]
    want_dz, want_zdz = fn(*args)
    got_dz, got_zdz = torch.compile(fn, fullgraph=True)(*args)
    assert torch.equal(got_dz, want_dz)
    assert torch.allclose(got_zdz, want_zdz, rtol=1e-5, atol=1e-5)


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


def test_the_triton_softmax_gradient_runs_in_place_under_tritons_interpreter():
    """The kernel a GPU runs, executed on the CPU by Triton's interpreter (a process of its own: the variable
    is read when the kernel is made), against the math written out: in place, several blocks per row, a last
    partial block, ignored rows."""
    pytest.importorskip("triton")
    code = TRITON_ON_THE_CPU.format(tests=str(Path(__file__).parent))
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


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
def test_on_the_gpu_ropes_backward_reads_sdpas_gradients_without_a_copy_first():
    """No transpose copy or concatenation before the pass: only the pass's own (Inductor) kernels run."""
    args = tuple(t.cuda() for t in rope_case(batch=2, seq=256, n_q=8, n_kv=2, head_dim=64))
    kernels = gpu_kernels(glue.rope_backward, *args)
    assert kernels and all(k.startswith("triton_") for k in kernels), kernels
    want_dz, want_zdz = glue.rope_backward.__wrapped__(*args)  # type: ignore[attr-defined]
    dz, zdz = glue.rope_backward(*args)
    assert (dz.double() - want_dz.double()).abs().max() <= 2**-7 * want_dz.double().abs().max()
    assert torch.allclose(zdz, want_zdz, rtol=1e-4, atol=1e-3)
