"""The same Llama-3 stack as :class:`~coda_agent.torch.CodaLlamaStack` in plain PyTorch: the tests' truth and
the end-to-end bench's eager and torch.compile baselines.

Written the way a model author writes it (RoPE per head from positions and theta, RMSNorm in FP32, logits in
FP32 for the loss), not from the ops' helpers, so a wrong layout in the ops (rotary pairs, gate/up interleave,
head split) shows up against it. RoPE is real arithmetic on the interleaved pairs (Meta's complex product,
spelled out) so Inductor can fuse it. Parameter names match the CODA stack's:
``ReferenceLlamaStack.like(stack)`` loads its weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layer import CodaLlamaLayer, CodaLlamaStack


class ReferenceLlamaLayer(nn.Module):
    """Pre-norm decoder layer: RMSNorm, fused QKV, interleaved RoPE, causal GQA (SDPA), o-proj, RMSNorm,
    SwiGLU."""

    def __init__(self, dim: int, ffn_dim: int, n_heads: int, n_kv_heads: int, *, rope_theta: float,
                 eps: float, device: torch.device | str | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.rope_theta, self.eps = rope_theta, eps
        qkv = (n_heads + 2 * n_kv_heads) * self.head_dim

        def empty(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype))

        self.attention_norm, self.wqkv, self.wo = empty(dim), empty(qkv, dim), empty(dim, dim)
        self.ffn_norm, self.w_gate_up, self.w_down = empty(dim), empty(2 * ffn_dim, dim), empty(dim, ffn_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        nq, nkv, d = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = (rms_norm(x, self.attention_norm, self.eps) @ self.wqkv.t()).split([nq * d, nkv * d,
                                                                                      nkv * d], dim=-1)
        q, k = (self._rope(t.reshape(batch, seq, -1, d)) for t in (q, k))
        v = v.reshape(batch, seq, nkv, d)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=nq != nkv)
        x = x + a.transpose(1, 2).reshape(batch, seq, dim) @ self.wo.t()
        gate, up = (rms_norm(x, self.ffn_norm, self.eps) @ self.w_gate_up.t()).unflatten(-1,
                                                                                         (-1, 2)).unbind(-1)
        return x + (F.silu(gate) * up) @ self.w_down.t()

    def _rope(self, t: torch.Tensor) -> torch.Tensor:
        """Each head's pair (x0, x1) at position p times e^(i p theta^(-2j/d)), in FP32: (B, S, H, d)."""
        seq, d = t.shape[1], t.shape[-1]
        freqs = self.rope_theta ** (-torch.arange(0, d, 2, device=t.device, dtype=torch.float32) / d)
        angle = torch.arange(seq, device=t.device, dtype=torch.float32)[:, None] * freqs
        cos, sin = angle.cos()[None, :, None], angle.sin()[None, :, None]
        x0, x1 = t.float().unflatten(-1, (-1, 2)).unbind(-1)
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2).to(t.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in FP32, rounded to the input's dtype before the weight (Llama-3's)."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class ReferenceHead(nn.Module):
    """Final RMSNorm, LM head, mean cross-entropy (FP32 logits) over the tokens not ``ignore_index``."""

    def __init__(self, dim: int, vocab: int, *, eps: float, ignore_index: int,
                 device: torch.device | str | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps, self.ignore_index = eps, ignore_index
        self.norm = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))
        self.weight = nn.Parameter(torch.empty(vocab, dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = (rms_norm(x, self.norm, self.eps) @ self.weight.t()).float()
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=self.ignore_index)


class ReferenceLlamaStack(nn.Module):
    """Layers then the head: hidden states (B, S, D) and targets (B, S) in, mean loss out."""

    def __init__(self, layers: list[ReferenceLlamaLayer], head: ReferenceHead) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.head = head

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        loss: torch.Tensor = self.head(x, targets)
        return loss

    @classmethod
    def like(cls, stack: CodaLlamaStack, dtype: torch.dtype | None = None) -> ReferenceLlamaStack:
        """The reference with ``stack``'s configuration and a copy of its weights, cast to ``dtype`` (default:
        theirs)."""
        # ModuleList is untyped
        coda_layers: list[CodaLlamaLayer] = list(stack.layers)  # type: ignore[arg-type]
        first = coda_layers[0]
        dim, vocab = stack.head.weight.shape[1], stack.head.weight.shape[0]
        device, dtype = stack.head.weight.device, dtype or stack.head.weight.dtype
        ffn_dim = first.w_down.shape[1]
        layers = [ReferenceLlamaLayer(dim, ffn_dim, layer.n_heads, layer.n_kv_heads,
                                      rope_theta=layer.rope_theta, eps=layer.eps, device=device,
                                      dtype=dtype) for layer in coda_layers]
        ref = cls(layers, ReferenceHead(dim, vocab, eps=first.eps, ignore_index=stack.head.ignore_index,
                                        device=device, dtype=dtype))
        ref.load_state_dict(stack.state_dict())
        return ref

