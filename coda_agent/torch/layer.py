"""A Llama-3 decoder layer and LM head whose non-attention work, forward and backward, runs the task kernels.

The autograd boundaries follow the kernels (docs/llama3-chain.md): every RMSNorm is deferred into the GEMM
that consumes it, so a producer hands on ``h``, ``h * gamma`` (``normed``) and ``rstd`` in a :class:`Stream`,
and the consumer's Function owns the norm's backward (``gemm_rmsnorm_bwd`` in its dgrad GEMM). ``normed``
and ``rstd`` are caches of ``h``: non-differentiable outputs, whose gradient reaches ``h`` and ``gamma``
through the consumer. The MLP is one Function because its backward is: ``gemm_swiglu_bwd`` is the down
projection's dgrad and SwiGLU's backward at once. Attention is torch's SDPA; the o-projection's backward and
every weight gradient are plain GEMMs.

The attention's residual is threaded through its first Function: ``_AttentionIn`` hands ``h`` on as an output
of its own, which the o-projection's Function adds. The residual's gradient then reaches ``_AttentionIn``'s
backward as a gradient of that output, and its ``gemm_rmsnorm_bwd`` reads it as ``dres``: no element-wise pass
adds the two gradients of ``h`` between the kernels (the o-projection's backward runs first, so autograd's own
sum of them would be one).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from . import glue, scaled_exp
from .ops import Kernels

IGNORE_INDEX = -100


class Stream(NamedTuple):
    """The residual stream between two kernels: ``h`` (B, S, D), ``normed = h * gamma`` of the next norm
    (its row scale deferred) and ``rstd`` (B, S), FP32."""

    h: torch.Tensor
    normed: torch.Tensor
    rstd: torch.Tensor


def begin(h: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> Stream:
    """The stream entering the first layer: its norm has no producer GEMM (the embedding), so a glue pass."""
    with torch.no_grad():
        normed, rstd = glue.rms_begin(h, norm_weight, eps)
        return Stream(h, normed, rstd)


@functools.lru_cache(maxsize=8)
def token_positions(batch: int, seq: int, device: torch.device) -> torch.Tensor:
    """Each token's position in its sequence, (batch * seq,) int64: made once per batch shape and device and
    shared by every layer and step (two glue kernels a layer a step otherwise). Read-only."""
    return torch.arange(seq, device=device).repeat(batch)


def rope_table(head_dim: int, n_heads: int, n_kv_heads: int, theta: float) -> torch.Tensor:
    """The per-column ``inv_freq`` the RoPE task takes: per-head frequencies, each for both lanes of its
    interleaved pair, over the Q and K heads; zero over V."""
    per_pair = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    head = per_pair.repeat_interleave(2)
    return torch.cat([head.repeat(n_heads + n_kv_heads), torch.zeros(n_kv_heads * head_dim)])


class _AttentionIn(torch.autograd.Function):
    """norm + QKV + RoPE (``gemm_rmsnorm_rope``), handed to SDPA as (B, heads, S, head_dim) views of its
    output, and ``h`` handed on as the residual; backward: RoPE's (one fused pass that reads SDPA's gradients
    where they lie, with zdz) then ``gemm_rmsnorm_bwd``, with the residual's gradient as its ``dres``."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, normed: torch.Tensor, rstd: torch.Tensor, gamma: torch.Tensor,
                w_qkv: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                heads: tuple[int, int, int], kernels: Kernels) -> tuple[torch.Tensor, ...]:
        qkv = kernels["gemm_rmsnorm_rope"](x=normed, w=w_qkv, rstd=rstd, positions=positions,
                                           inv_freq=inv_freq)["out"]
        ctx.save_for_backward(h, rstd, gamma, w_qkv, inv_freq, qkv)
        ctx.kernels = kernels
        batch, n_q, n_kv = heads
        head_dim = qkv.shape[1] // (n_q + 2 * n_kv)
        q, k, v = qkv.view(batch, -1, n_q + 2 * n_kv, head_dim).split([n_q, n_kv, n_kv], dim=2)
        # h as an output of this Function (autograd makes it an alias), so its gradient comes back here
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), h

    @staticmethod
    def backward(ctx: Any, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                 dres: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        h, rstd, gamma, w_qkv, inv_freq, qkv = ctx.saved_tensors
        dz, zdz = glue.rope_backward(dq, dk, dv, qkv, inv_freq)
        kernels: Kernels = ctx.kernels
        out = kernels["gemm_rmsnorm_bwd"](dz=dz, w=kernels.dgrad_weight(w_qkv), h=h, gamma=gamma, rstd=rstd,
                                          zdz=zdz, dres=dres.contiguous())
        return (
            out["dh"],
            None,
            None,
            out["dgamma"].to(gamma.dtype),
            dz.t() @ out["normed"],
            None,
            None,
            None,
            None,
        )


class _AttentionOut(torch.autograd.Function):
    """o-proj + residual + the next norm's statistics (``gemm_residual_rmsnorm``); backward: plain GEMMs."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, w_o: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor,
                eps: float, kernels: Kernels) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = kernels["gemm_residual_rmsnorm"](x=a, w=w_o, residual=residual, gamma=gamma, eps=eps)
        ctx.save_for_backward(a, w_o)
        ctx.mark_non_differentiable(out["normed"], out["rstd"])
        ctx.set_materialize_grads(False)  # no zero-filled gradients for the caches: the backward ignores them
        return out["h"], out["normed"], out["rstd"]

    @staticmethod
    def backward(ctx: Any, dh: torch.Tensor, _dnormed: Any, _drstd: Any) -> tuple[torch.Tensor | None, ...]:
        a, w_o = ctx.saved_tensors
        return dh @ w_o, dh.t() @ a, dh, None, None, None


class _Mlp(torch.autograd.Function):
    """norm + gate/up + SwiGLU (``gemm_rmsnorm_swiglu``), down + residual + the next norm's statistics
    (``gemm_residual_rmsnorm``); backward: ``gemm_swiglu_bwd`` then ``gemm_rmsnorm_bwd``."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, normed: torch.Tensor, rstd: torch.Tensor, gamma: torch.Tensor,
                w_gate_up: torch.Tensor, w_down: torch.Tensor, next_gamma: torch.Tensor, eps: float,
                kernels: Kernels) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mlp = kernels["gemm_rmsnorm_swiglu"](x=normed, w=w_gate_up, rstd=rstd)
        out = kernels["gemm_residual_rmsnorm"](x=mlp["act"], w=w_down, residual=h, gamma=next_gamma, eps=eps)
        ctx.save_for_backward(h, rstd, gamma, w_gate_up, w_down, mlp["preact"])
        ctx.kernels = kernels
        ctx.mark_non_differentiable(out["normed"], out["rstd"])
        ctx.set_materialize_grads(False)  # no zero-filled gradients for the caches: the backward ignores them
        return out["h"], out["normed"], out["rstd"]

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor, _dnormed: Any, _drstd: Any) -> tuple[torch.Tensor | None, ...]:
        h, rstd, gamma, w_gate_up, w_down, preact = ctx.saved_tensors
        dy = dy.contiguous()
        kernels: Kernels = ctx.kernels
        swiglu = kernels["gemm_swiglu_bwd"](dy=dy, w_down=kernels.dgrad_weight(w_down), preact=preact)
        norm = kernels["gemm_rmsnorm_bwd"](dz=swiglu["dpreact"], w=kernels.dgrad_weight(w_gate_up), h=h,
                                           gamma=gamma, rstd=rstd, zdz=swiglu["zdz"], dres=dy)
        dw_gate_up = swiglu["dpreact"].t() @ norm["normed"]
        return (
            norm["dh"],
            None,
            None,
            norm["dgamma"].to(gamma.dtype),
            dw_gate_up,
            dy.t() @ swiglu["act"],
            None,
            None,
            None,
        )


class _LMHeadLoss(torch.autograd.Function):
    """final norm + LM head + mean cross-entropy over the counted tokens (``gemm_rmsnorm_cross_entropy``);
    backward: the logits it kept turned into dlogits in place (one memory-bound pass), or with
    ``keep_logits=False`` recomputed by ``gemm_rmsnorm_cross_entropy_bwd``; then ``gemm_rmsnorm_bwd``."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, normed: torch.Tensor, rstd: torch.Tensor, gamma: torch.Tensor,
                w: torch.Tensor, targets: torch.Tensor, ignore_index: int, keep_logits: bool,
                kernels: Kernels) -> torch.Tensor:
        out = kernels["gemm_rmsnorm_cross_entropy"](x=normed, w=w, rstd=rstd, targets=targets,
                                                    ignore_index=ignore_index)
        counted = (targets != ignore_index).sum().clamp(min=1).float()
        # the forward's own logits, or what recomputing them takes
        kept = out["logits"] if keep_logits else normed
        ctx.save_for_backward(h, rstd, gamma, w, targets, out["lse"], counted, kept)
        ctx.ignore_index, ctx.keep_logits, ctx.kernels = ignore_index, keep_logits, kernels
        return out["loss"].sum() / counted

    @staticmethod
    def backward(ctx: Any, dloss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        h, rstd, gamma, w, targets, lse, counted, kept = ctx.saved_tensors
        per_token = (dloss.float() / counted).expand(targets.shape)
        kernels: Kernels = ctx.kernels
        if ctx.keep_logits:
            dlogits, zdz = kept, glue.softmax_grad_(kept, lse, targets, per_token, ctx.ignore_index)
        else:
            ce = kernels["gemm_rmsnorm_cross_entropy_bwd"](x=kept, w=w, rstd=rstd, targets=targets, lse=lse,
                                                           dloss=per_token.contiguous(),
                                                           ignore_index=ctx.ignore_index)
            dlogits, zdz = ce["dlogits"], ce["zdz"]
        norm = kernels["gemm_rmsnorm_bwd"](dz=dlogits, w=kernels.dgrad_weight(w), h=h, gamma=gamma, rstd=rstd,
                                           zdz=zdz, dres=torch.zeros_like(h))
        dw = dlogits.t() @ norm["normed"]
        return norm["dh"], None, None, norm["dgamma"].to(gamma.dtype), dw, None, None, None, None


class _ScaledExpHeadLoss(torch.autograd.Function):
    """final norm (element-wise) + LM head + mean cross-entropy through QuACK's scaled-exp pipeline
    (:mod:`.scaled_exp`), whose forward already makes the head's gradients; backward: those scaled by
    ``dloss``, then the final norm's backward (element-wise)."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, rstd: torch.Tensor, gamma: torch.Tensor, w: torch.Tensor,
                targets: torch.Tensor, ignore_index: int, chunk: int) -> torch.Tensor:
        x = glue.rms_normalize(h, rstd, gamma)  # rounded once, from h (``normed`` is already rounded)
        counted = (targets != ignore_index).sum().clamp(min=1).float()
        loss, dx, dw = scaled_exp.scaled_exp_cross_entropy(x, w, targets, counted.reciprocal(), ignore_index,
                                                           chunk)
        ctx.save_for_backward(h, rstd, gamma, dx, dw)
        ctx.weight_dtype = w.dtype
        return loss.sum() / counted

    @staticmethod
    def backward(ctx: Any, dloss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        h, rstd, gamma, dx, dw = ctx.saved_tensors
        dh, dgamma = glue.rmsnorm_backward(h, gamma, rstd, dx, dloss)
        dw_rounded = glue.scaled_cast(dw, dloss, ctx.weight_dtype)
        return dh, None, dgamma.to(gamma.dtype), dw_rounded, None, None, None


def _weight(*shape: int, std: float, device: torch.device | str | None, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape, device=device, dtype=torch.float32).mul_(std).to(dtype))


class CodaLlamaLayer(nn.Module):
    """A pre-norm Llama-3 decoder layer (RMSNorm, fused QKV with interleaved RoPE, causal GQA through SDPA,
    o-projection, RMSNorm, SwiGLU MLP) on the task kernels.

    Weights are ``nn.Linear``-shaped: ``wqkv`` rows are [Q heads, K heads, V heads] with each head's rotary
    pairs interleaved (Meta's layout; HF rotate-half checkpoints need their Q/K rows permuted), ``w_gate_up``
    rows interleave gate j and up j. ``forward`` takes the :class:`Stream` and the weight of the norm that
    follows the layer (the next layer's attention norm, or the final norm), whose statistics the down
    projection's epilogue computes.
    """

    def __init__(self, dim: int, ffn_dim: int, n_heads: int, n_kv_heads: int, *, rope_theta: float = 500000.0,
                 eps: float = 1e-5, kernels: Kernels | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        if dim % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"dim {dim} must split into {n_heads} heads, and those into {n_kv_heads} groups")
        self.n_heads, self.n_kv_heads, self.head_dim, self.eps = n_heads, n_kv_heads, dim // n_heads, eps
        self.rope_theta = rope_theta
        self.kernels = kernels or Kernels()
        qkv = (n_heads + 2 * n_kv_heads) * self.head_dim
        self.attention_norm = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self.wqkv = _weight(qkv, dim, std=dim**-0.5, device=device, dtype=dtype)
        self.wo = _weight(dim, dim, std=dim**-0.5, device=device, dtype=dtype)
        self.ffn_norm = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self.w_gate_up = _weight(2 * ffn_dim, dim, std=dim**-0.5, device=device, dtype=dtype)
        self.w_down = _weight(dim, ffn_dim, std=ffn_dim**-0.5, device=device, dtype=dtype)
        self.register_buffer("inv_freq", rope_table(self.head_dim, n_heads, n_kv_heads,
                                                    rope_theta).to(device), persistent=False)

    def forward(self, stream: Stream, next_norm: torch.Tensor) -> Stream:
        batch, seq, dim = stream.h.shape
        tokens = batch * seq
        h, normed, rstd = (
            stream.h.reshape(tokens, dim),
            stream.normed.reshape(tokens, dim),
            stream.rstd.reshape(tokens),
        )
        positions = token_positions(batch, seq, h.device)
        q, k, v, residual = _AttentionIn.apply(h, normed, rstd, self.attention_norm, self.wqkv, positions,
                                               self.inv_freq, (batch, self.n_heads, self.n_kv_heads),
                                               self.kernels)
        a = self._attention(q, k, v).reshape(tokens, dim)
        h1, normed1, rstd1 = _AttentionOut.apply(a, self.wo, residual, self.ffn_norm, self.eps, self.kernels)
        h2, normed2, rstd2 = _Mlp.apply(h1, normed1, rstd1, self.ffn_norm, self.w_gate_up, self.w_down,
                                        next_norm, self.eps, self.kernels)
        return Stream(h2.view(batch, seq, dim), normed2.view(batch, seq, dim), rstd2.view(batch, seq))

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal grouped-query attention (torch's SDPA) on (B, heads, S, head_dim), heads concatenated:
        (B, S, n_heads * head_dim)."""
        batch, _, seq, _ = q.shape
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             enable_gqa=self.n_heads != self.n_kv_heads)
        return out.transpose(1, 2).reshape(batch, seq, -1)


class CodaLMHead(nn.Module):
    """The final RMSNorm, the LM head and the mean cross-entropy over the tokens whose target is not
    ``ignore_index``, on the task kernels.

    The forward's logits (M x V, bf16) stay until the backward, which turns them into dlogits in place: the
    backward runs no logits GEMM. ``keep_logits=False`` keeps nothing that size and recomputes them in the
    backward instead (2·M·V·K more FLOPs, the trade Liger-style fused cross-entropy makes, for a vocabulary
    whose logits would not fit). Where its kernels say so (:meth:`Kernels.scaled_exp_rows`, by default), the
    head runs QuACK's scaled-exp cross-entropy instead (:mod:`.scaled_exp`): every GEMM in the forward, in
    chunks of rows, no logits kept.
    """

    def __init__(self, dim: int, vocab: int, *, ignore_index: int = IGNORE_INDEX, keep_logits: bool = True,
                 kernels: Kernels | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.ignore_index, self.keep_logits = ignore_index, keep_logits
        self.kernels = kernels or Kernels()
        self.norm = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self.weight = _weight(vocab, dim, std=dim**-0.5, device=device, dtype=dtype)

    def forward(self, stream: Stream, targets: torch.Tensor) -> torch.Tensor:
        dim = stream.h.shape[-1]
        loss: torch.Tensor
        chunk = self.kernels.scaled_exp_rows(self.weight.shape[0], self.weight.dtype)
        if chunk:
            loss = _ScaledExpHeadLoss.apply(stream.h.reshape(-1, dim), stream.rstd.reshape(-1), self.norm,
                                            self.weight, targets.reshape(-1), self.ignore_index, chunk)
            return loss
        loss = _LMHeadLoss.apply(stream.h.reshape(-1, dim), stream.normed.reshape(-1, dim),
                                 stream.rstd.reshape(-1), self.norm, self.weight, targets.reshape(-1),
                                 self.ignore_index, self.keep_logits, self.kernels)
        return loss


class CodaLlamaStack(nn.Module):
    """Layers then the LM head: hidden states (B, S, D) from the embedding and targets (B, S) in, mean loss
    out.

    It threads the :class:`Stream`: each layer's down projection computes the statistics of the norm after it.
    """

    def __init__(self, layers: Sequence[CodaLlamaLayer], head: CodaLMHead) -> None:
        super().__init__()
        if not layers:
            raise ValueError("a stack needs at least one layer")
        self.layers = nn.ModuleList(layers)
        self.head = head

    def use(self, kernels: Kernels) -> None:
        """Run every layer and the head on ``kernels`` from the next step on (say, a run's ``best.py`` for one
        task)."""
        for module in (*self.layers, self.head):
            module.kernels = kernels

    def forward(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        layers: list[CodaLlamaLayer] = list(self.layers)  # type: ignore[arg-type]  # ModuleList is untyped
        stream = begin(h, layers[0].attention_norm, layers[0].eps)
        for i, layer in enumerate(layers):
            stream = layer(stream, layers[i + 1].attention_norm if i + 1 < len(layers) else self.head.norm)
        loss: torch.Tensor = self.head(stream, targets)
        return loss
