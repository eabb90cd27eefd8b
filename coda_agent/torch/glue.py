"""The chain's two memory-bound passes that are not GEMM epilogues, each one kernel on a GPU.

- **The softmax gradient** turns the LM head's stored logits into dlogits in place and reduces each row's
  ``zdz``. An epilogue cannot do it (a row's LSE is final only after its last tile), and rerunning the logits
  GEMM to get there costs 2·M·V·K FLOPs; this pass reads and writes M·V values once. On a GPU it is a Triton
  kernel of its own, a program per row that streams the row once, in place: Inductor's build of the same math
  stages the new values in an M x V buffer before the copy (seen in its generated code), which at a 128k
  vocabulary is 8 GiB more at the step's peak. ``torch.ops.coda.softmax_grad_`` is a custom op that mutates
  the logits, so a caller's torch.compile keeps it whole.
- **RoPE's backward** rotates the attention's input gradients back and reduces ``zdz``. The rotation acts on
  the next dgrad GEMM's A operand, which an epilogue cannot transform. It reads the gradients in the layout
  SDPA's backward leaves them, so no transpose copy or concatenation runs before it. On a GPU it runs through
  torch.compile: Inductor writes it as one pass that reads once and writes once.

On a CPU (the emulator's world, tests) both run as plain torch: Inductor's CPU build would cost more than it
saves. Inside a caller's own torch.compile, RoPE's backward is traced as written, so the caller's graph fuses
it.
"""

from __future__ import annotations

import functools
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


@torch.library.custom_op("coda::softmax_grad_", mutates_args={"logits"})
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


@softmax_grad_.register_fake
def _(logits: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor, dloss: torch.Tensor,
      ignore_index: int) -> torch.Tensor:
    return logits.new_empty(logits.shape[0], dtype=torch.float32)


#: Columns a program of the Triton pass loads at a time.
SOFTMAX_GRAD_BLOCK = 4096


@softmax_grad_.register_kernel("cuda")
def _(logits: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor, dloss: torch.Tensor,
      ignore_index: int) -> torch.Tensor:
    return softmax_grad_triton(logits, lse, targets, dloss, ignore_index)


def softmax_grad_triton(logits: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor, dloss: torch.Tensor,
                        ignore_index: int, block: int = SOFTMAX_GRAD_BLOCK) -> torch.Tensor:
    """The softmax gradient as one Triton launch, a program per row (any device Triton runs on: a GPU, or the
    CPU under ``TRITON_INTERPRET=1``, as the tests run it)."""
    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("the softmax gradient needs each row of the logits contiguous")
    zdz = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows == 0:  # no program to launch
        return zdz
    dloss = dloss.expand(rows).contiguous()
    _softmax_grad_kernel()[(rows,)](logits, lse.contiguous(), targets.contiguous(), dloss, zdz, vocab,
                                    logits.stride(0), ignore_index, BLOCK=block, num_warps=8)
    return zdz


@functools.cache
def _softmax_grad_kernel() -> Any:
    """The Triton kernel, made on first use (Triton is imported only when a GPU pass runs); its name is what a
    profiler's kernel table shows."""
    import triton
    import triton.language as tl

    @triton.jit
    def softmax_grad_in_place(logits_ptr, lse_ptr, targets_ptr, dloss_ptr, zdz_ptr, vocab, row_stride,
                              ignore_index, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base = logits_ptr + row.to(tl.int64) * row_stride
        target = tl.load(targets_ptr + row)
        lse = tl.load(lse_ptr + row)
        scale = tl.where(target != ignore_index, tl.load(dloss_ptr + row), 0.0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < vocab
            z = tl.load(base + cols, mask=inside, other=0.0).to(tl.float32)
            d = tl.where(inside, scale * (tl.exp(z - lse) - (cols == target).to(tl.float32)), 0.0)
            acc += d * z
            tl.store(base + cols, d.to(logits_ptr.dtype.element_ty), mask=inside)
        tl.store(zdz_ptr + row, tl.sum(acc, axis=0))

    return softmax_grad_in_place


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
    n_kv = dk.shape[1]
    position = torch.arange(seq, device=dq.device, dtype=torch.float32)[:, None, None]
    freqs = inv_freq[: (n_q + n_kv) * head_dim].view(-1, head_dim)  # Q and K heads; a pair's lanes share one
    sign = torch.tensor([1.0, -1.0], device=dq.device).repeat(head_dim // 2)
    grads = [g.transpose(1, 2).float() for g in (dq, dk, dv)]  # (B, S, heads, head_dim)
    saved = qkv.view(batch, seq, -1, head_dim).float().split([n_q, n_kv, n_kv], dim=2)
    # Each pair (y1, y2) -> (y1 c + y2 s, y2 c - y1 s), written as the tensor and its pair-swapped self: no
    # stack, so Inductor writes each part straight into its slice of dz and keeps no FP32 copy of the whole.
    parts = []
    for g, f in zip(grads[:2], freqs.split([n_q, n_kv]), strict=True):
        angle = position * f
        swapped = g.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
        parts.append(g * angle.cos() + swapped * (angle.sin() * sign))
    parts.append(grads[2])
    dz = torch.cat([p.flatten(2).to(qkv.dtype) for p in parts], dim=-1).reshape(batch * seq, -1)
    zdz = sum((z * g).sum((-2, -1)) for z, g in zip(saved, grads, strict=True))
    return dz, zdz.reshape(batch * seq)
