"""The suite's tasks chain through a Llama-3 layer: forward and backward wired from the human kernels (the
emulator) as ``docs/llama3-chain.md`` tabulates them, against PyTorch autograd on the same bf16 values in
FP32.

A wrong hand-off between two tasks (a pre-activation saved without its row scale, a statistic summed over the
wrong tensor, a missing output) shows up as a gradient far off, well beyond the few bf16 roundings of the
chain.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from coda_agent.tasks import find_task

M, H, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 48, 64, 4, 2, 16, 96, 160
QKV = (HEADS + 2 * KV_HEADS) * HEAD_DIM
EPS, IGNORE = 1e-6, -100
BF16 = torch.bfloat16


def human(task: str) -> Callable[..., dict[str, torch.Tensor]]:
    """The task's hand-written kernel's forward(), imported in this process (it runs on the emulator)."""
    path = find_task(task).human_file
    assert path is not None
    spec = importlib.util.spec_from_file_location(f"chain_{task}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.forward


def rope_inv_freq() -> torch.Tensor:
    """The per-column table the RoPE tasks take: per-head frequencies, duplicated per pair, zero over V."""
    per_pair = 500000.0 ** (-torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)
    head = per_pair.repeat_interleave(2)
    return torch.cat([head.repeat(HEADS + KV_HEADS), torch.zeros(KV_HEADS * HEAD_DIM)])


def rotate(y: torch.Tensor, theta: torch.Tensor, sign: float) -> torch.Tensor:
    """Rotate every interleaved pair of y by sign * theta (per row and pair)."""
    c, s = theta.cos(), sign * theta.sin()
    y1, y2 = y[:, 0::2], y[:, 1::2]
    return torch.stack((y1 * c - y2 * s, y1 * s + y2 * c), dim=-1).flatten(-2)


def attention(qkv: torch.Tensor) -> torch.Tensor:
    """Causal grouped-query attention over one sequence (what stays torch's SDPA in a CODA layer)."""
    q = qkv[:, : HEADS * HEAD_DIM].view(M, HEADS, HEAD_DIM).transpose(0, 1)
    k, v = (qkv[:, (HEADS + i * KV_HEADS) * HEAD_DIM :][:, : KV_HEADS * HEAD_DIM] for i in (0, 1))
    k, v = (
        t.reshape(M, KV_HEADS, HEAD_DIM).transpose(0, 1).repeat_interleave(HEADS // KV_HEADS, 0)
        for t in (k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(M,
                                                                                           HEADS * HEAD_DIM)


def draw_layer(seed: int = 0) -> dict[str, torch.Tensor]:
    """One layer's parameters and inputs, bf16 (a residual stream of rms ~4, so rstd is far from 1)."""
    g = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * std).to(BF16)

    def gamma() -> torch.Tensor:
        return (torch.rand(H, generator=g) + 0.5).to(BF16)

    targets = torch.randint(0, VOCAB, (M,), generator=g)
    targets[torch.rand(M, generator=g) < 0.2] = IGNORE
    return {
        "h0": normal(M, H, std=4.0), "w_qkv": normal(QKV, H, std=H**-0.5), "w_o": normal(H, H, std=H**-0.5),
        "w_gate_up": normal(2 * FFN, H, std=H**-0.5), "w_down": normal(H, FFN, std=FFN**-0.5),
        "w_lm": normal(VOCAB, H, std=H**-0.5), "g_attn": gamma(), "g_ffn": gamma(), "g_final": gamma(),
        "targets": targets, "positions": torch.arange(M),
    }


@pytest.fixture(scope="module")
def layer() -> dict[str, torch.Tensor]:
    return draw_layer()


def autograd_layer(p: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The plain PyTorch layer (pre-norm, RoPE, GQA, SwiGLU) + final norm + LM head + mean CE, in FP32."""
    leaves = {k: v.float().requires_grad_() for k, v in p.items() if v.is_floating_point()}

    def rms(h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * g

    theta = p["positions"][:, None].float() * rope_inv_freq()[None, 0::2]
    qkv = rotate(rms(leaves["h0"], leaves["g_attn"]) @ leaves["w_qkv"].t(), theta, 1.0)
    h1 = attention(qkv) @ leaves["w_o"].t() + leaves["h0"]
    z = rms(h1, leaves["g_ffn"]) @ leaves["w_gate_up"].t()
    h2 = (F.silu(z[:, 0::2]) * z[:, 1::2]) @ leaves["w_down"].t() + h1
    loss = F.cross_entropy(rms(h2, leaves["g_final"]) @ leaves["w_lm"].t(), p["targets"], ignore_index=IGNORE)
    loss.backward()
    grads = {k: v.grad for k, v in leaves.items()}
    assert all(g is not None for g in grads.values())
    return loss.detach(), {k: g for k, g in grads.items() if g is not None}


def task_chain(p: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
    """The same layer from the tasks' human kernels, each output handed on as docs/llama3-chain.md says."""
    mm = lambda a, b: (a.float() @ b.float())  # noqa: E731 - the weight gradients: plain GEMMs
    out: dict[str, Any] = {}
    # forward -------------------------------------------------------------------------------------
    h0 = p["h0"]
    rstd0 = torch.rsqrt(h0.float().pow(2).mean(-1) + EPS)  # the first layer's norm: elementwise glue
    normed0 = h0 * p["g_attn"]
    inv_freq = rope_inv_freq()
    qkv = human("gemm_rmsnorm_rope")(x=normed0, w=p["w_qkv"], rstd=rstd0, positions=p["positions"],
                                     inv_freq=inv_freq)["out"]
    qkv_leaf = qkv.float().requires_grad_()
    a_f32 = attention(qkv_leaf)
    a = a_f32.detach().to(BF16)
    block = human("gemm_rmsnorm_gemm")(a=a, w_o=p["w_o"], residual=h0, gamma=p["g_ffn"],
                                       w_gate_up=p["w_gate_up"], eps=EPS)
    k0 = human("gemm_residual_rmsnorm")(x=a, w=p["w_o"], residual=h0, gamma=p["g_ffn"], eps=EPS)
    k2 = human("gemm_rmsnorm_swiglu")(x=k0["normed"], w=p["w_gate_up"], rstd=k0["rstd"])
    out["block_vs_k0_k2"] = {"h": (block["h"], k0["h"]), "rstd": (block["rstd"], k0["rstd"]),
                             "act": (block["act"], k2["act"]), "preact": (block["preact"], k2["preact"])}
    h1, rstd1, act, preact = block["h"], block["rstd"], block["act"], block["preact"]
    down = human("gemm_residual_rmsnorm")(x=act, w=p["w_down"], residual=h1, gamma=p["g_final"], eps=EPS)
    h2, normed2, rstd2 = down["h"], down["normed"], down["rstd"]
    head = human("gemm_rmsnorm_cross_entropy")(x=normed2, w=p["w_lm"], rstd=rstd2, targets=p["targets"],
                                               ignore_index=IGNORE)
    counted = int((p["targets"] != IGNORE).sum())
    loss = head["loss"].sum() / counted
    # backward ------------------------------------------------------------------------------------
    grads: dict[str, torch.Tensor] = {}
    dloss = torch.full((M,), 1.0 / counted)
    ce = human("gemm_rmsnorm_cross_entropy_bwd")(x=normed2, w=p["w_lm"], rstd=rstd2, targets=p["targets"],
                                                 lse=head["lse"], dloss=dloss, ignore_index=IGNORE)
    final = human("gemm_rmsnorm_bwd")(dz=ce["dlogits"], w=p["w_lm"], h=h2, gamma=p["g_final"], rstd=rstd2,
                                      zdz=ce["zdz"], dres=torch.zeros_like(h2))
    grads["w_lm"], grads["g_final"], dh2 = (mm(ce["dlogits"].t(), final["normed"]), final["dgamma"],
                                            final["dh"])
    mlp = human("gemm_swiglu_bwd")(dy=dh2, w_down=p["w_down"], preact=preact)
    grads["w_down"] = mm(dh2.t(), mlp["act"])
    ffn = human("gemm_rmsnorm_bwd")(dz=mlp["dpreact"], w=p["w_gate_up"], h=h1, gamma=p["g_ffn"], rstd=rstd1,
                                    zdz=mlp["zdz"], dres=dh2)
    grads["w_gate_up"], grads["g_ffn"], dh1 = mm(mlp["dpreact"].t(), ffn["normed"]), ffn["dgamma"], ffn["dh"]
    grads["w_o"] = mm(dh1.t(), a)
    (dqkv,) = torch.autograd.grad(a_f32, qkv_leaf, mm(dh1, p["w_o"]).to(BF16).float())
    dqkv = dqkv.to(BF16).float()
    theta = p["positions"][:, None].float() * inv_freq[None, 0::2]
    dz_qkv = rotate(dqkv, theta, -1.0).to(BF16)  # RoPE backward: elementwise glue (CODA's rope_bwd_zdz)
    zdz0 = (qkv.float() * dqkv).sum(-1)  # the rotation is orthogonal: sum(dz * z) = sum(dqkv * qkv)
    attn = human("gemm_rmsnorm_bwd")(dz=dz_qkv, w=p["w_qkv"], h=h0, gamma=p["g_attn"], rstd=rstd0, zdz=zdz0,
                                     dres=dh1)
    grads["w_qkv"], grads["g_attn"], grads["h0"] = mm(dz_qkv.t(), attn["normed"]), attn["dgamma"], attn["dh"]
    out["grads"] = grads
    return loss, out


@pytest.fixture(scope="module")
def both(layer: dict[str, torch.Tensor]) -> tuple[
    tuple[torch.Tensor, dict[str, torch.Tensor]], tuple[torch.Tensor, dict[str, Any]]]:
    return autograd_layer(layer), task_chain(layer)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


def test_the_chain_has_counted_and_ignored_tokens(layer):
    ignored = int((layer["targets"] == IGNORE).sum())
    assert 0 < ignored < M


def test_the_block_task_is_k0_then_k2(both):
    _, (_, chain) = both
    for name, (block, parts) in chain["block_vs_k0_k2"].items():
        assert relative_error(block, parts) < 1e-3, name


def test_the_loss_matches_autograd(both):
    (loss, _), (chain_loss, _) = both
    assert math.isclose(float(chain_loss), float(loss), rel_tol=1e-2)


@pytest.mark.parametrize("name",
                         ["h0", "g_attn", "w_qkv", "w_o", "g_ffn", "w_gate_up", "w_down", "g_final", "w_lm"])
def test_every_gradient_matches_autograd(both, name):
    (_, want), (_, chain) = both
    err = relative_error(chain["grads"][name], want[name])
    assert err < 2e-2, f"d{name}: relative error {err:.3g}"
