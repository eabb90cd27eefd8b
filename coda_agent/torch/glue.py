"""The chain's two memory-bound passes that are not GEMM epilogues, each one fused kernel on a GPU.

- **The softmax gradient** turns the LM head's stored logits into dlogits in place and reduces each row's
  ``zdz``. An epilogue cannot do it (a row's LSE is final only after its last tile), and rerunning the logits
  GEMM to get there costs 2·M·V·K FLOPs; this pass reads and writes M·V values once.
- **RoPE's backward** rotates the attention's input gradients back and reduces ``zdz``. The rotation acts on
  the next dgrad GEMM's A operand, which an epilogue cannot transform. It reads the gradients in the layout
  SDPA's backward leaves them, so no transpose copy or concatenation runs before it.

On a GPU each runs through torch.compile: Inductor writes one kernel that reads once, writes once and
folds the reduction into the same loop. On a CPU (the emulator's world, tests) they run as written: Inductor's
CPU build would cost more than it saves. Inside a caller's own torch.compile they are traced as written, so
the caller's graph fuses them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])


def fused_on_gpu(fn: F) -> F:
    """``fn`` compiled by Inductor (once, on first use) for CUDA tensors; as written anywhere else."""
    compiled: Callable[..., Any] | None = None

    @wraps(fn)
    def run(*args: Any) -> Any:
        nonlocal compiled
        if args[0].device.type != "cuda" or torch.compiler.is_compiling():
            return fn(*args)
        if compiled is None:
            compiled = torch.compile(fn, fullgraph=True)
        return compiled(*args)

    return run  # type: ignore[return-value]


@fused_on_gpu
def softmax_grad_(logits: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor, dloss: torch.Tensor,
                  ignore_index: int) -> torch.Tensor:
    """Overwrite ``logits`` (M, V) with ``dlogits = dloss * (softmax(logits) - onehot(targets))`` and return
    ``zdz = sum_j dlogits_j * logits_j`` (FP32, M), the final norm's correction statistic.

    ``lse`` is the forward's FP32 log-sum-exp, ``dloss`` the loss gradient per token; a row whose target is
    ``ignore_index`` gets zero dlogits and a zero ``zdz``. Math in FP32, dlogits rounded once to the logits'
    dtype, as ``gemm_rmsnorm_cross_entropy_bwd`` computes them from the recomputed logits.
    """
    z = logits.float()
    counted = targets != ignore_index
    scale = torch.where(counted, dloss, 0.0)[:, None]
    onehot = torch.arange(z.shape[1], device=z.device)[None, :] == targets[:, None]
    dlogits = scale * (torch.exp(z - lse[:, None]) - onehot.float())
    zdz = (dlogits * z).sum(-1)
    logits.copy_(dlogits)
    return zdz


@fused_on_gpu
def rope_backward(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, qkv: torch.Tensor,
                  inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's backward and the QKV norm's ``zdz`` from the attention's input gradients.

    ``dq``, ``dk``, ``dv`` are (B, heads, S, head_dim) in whatever layout SDPA's backward gave them; ``qkv``
    (B*S, (Hq + 2*Hkv) * head_dim) is the forward's rotated output, token ``b*S + s`` at position ``s``, and
    ``inv_freq`` the task's per-column table. Returns ``dz`` (B*S, qkv columns) in ``qkv``'s dtype, every
    interleaved pair of Q and K rotated by ``-position * inv_freq``, V as is; and ``zdz = sum_j dqkv_j *
    qkv_j`` in FP32 (the rotation is orthogonal, so this equals the sum over ``dz`` and the unrotated
    outputs).
    """
    batch, n_q, seq, head_dim = dq.shape
    position = torch.arange(seq, device=dq.device, dtype=torch.float32)[:, None, None]
    # (Q and K heads, head_dim / 2)
    freqs = inv_freq[: (n_q + dk.shape[1]) * head_dim].view(-1, head_dim)[:, 0::2]
    grads = [g.transpose(1, 2).float() for g in (dq, dk, dv)]  # (B, S, heads, head_dim)
    rotated = []
    for g, f in zip(grads[:2], freqs.split([n_q, dk.shape[1]]), strict=True):
        angle = position * f  # (S, heads, head_dim / 2)
        cos, sin = angle.cos(), angle.sin()
        y1, y2 = g[..., 0::2], g[..., 1::2]
        rotated.append(torch.stack((y1 * cos + y2 * sin, y2 * cos - y1 * sin), dim=-1).flatten(-2))
    dqkv = torch.cat([t.flatten(2) for t in grads], dim=-1).reshape(batch * seq, -1)
    dz = torch.cat([t.flatten(2) for t in (*rotated, grads[2])], dim=-1).reshape(batch * seq, -1)
    zdz = (qkv.float() * dqkv).sum(-1)
    return dz.to(qkv.dtype), zdz
