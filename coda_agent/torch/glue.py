"""The chain's memory-bound passes that are not GEMM epilogues, each one kernel on a GPU.

- **The softmax gradient** turns the LM head's stored logits into dlogits in place and reduces each row's
  ``zdz``. An epilogue cannot do it (a row's LSE is final only after its last tile), and rerunning the logits
  GEMM to get there costs 2·M·V·K FLOPs; this pass reads and writes M·V values once. On a GPU it is a Triton
  kernel of its own, a program per row that streams the row once, in place: Inductor's build of the same math
  stages the new values in an M x V buffer before the copy (seen in its generated code), which at a 128k
  vocabulary is 8 GiB more at the step's peak. ``torch.ops.coda.softmax_grad_`` mutates the logits.
- **RoPE's backward** rotates the attention's input gradients back and reduces ``zdz``. The rotation acts on
  the next dgrad GEMM's A operand, which an epilogue cannot transform. It reads the gradients in the layout
  SDPA's backward leaves them, so no transpose copy or concatenation runs before it. On a GPU it is a Triton
  kernel of its own, a program per block of tokens through every head, so each token's ``zdz`` is summed in
  registers: Inductor's build of the same function took 1.08 ms a layer at the 1B stack's batch (H200,
  2026-12-05), about six times what its 600 MB of traffic needs. Its rows are read and written whole, the
  pairs split in registers: a first version that addressed each pair's lanes apart moved 2 bytes an access and
  took 2.39 ms a layer (``bench/results/h200-2026-12-05-c-e2e.md``).

- **The final RMSNorm, forward and backward, beside QuACK's scaled-exp head** (:mod:`.scaled_exp`), whose
  GEMMs take the normalized rows and give their gradient, so the norm cannot ride in their epilogues: the
  forward is a Triton pass from the stream's ``h`` and ``rstd`` (one read and write of M x D), the backward
  one Triton pass that takes the loss gradient as a scale on ``dy`` (eager torch multiplied by it first, a
  pass of its own over M x D), and the head weight's FP32 gradient is scaled and rounded in one more.
- **The first norm's statistics**: the stream entering the first layer has no producer GEMM, so its
  ``rstd`` and ``h * gamma`` come from one Triton pass over ``h`` (eager torch took five kernels: a cast, a
  square, a mean, a reciprocal root and the product).

All are custom ops (``torch.ops.coda``), so a caller's torch.compile keeps each whole. On a CPU (the
emulator's world, tests) each runs as plain torch; the Triton kernels (:mod:`._glue_kernels`) also run there
under Triton's interpreter, as the tests run them.
"""

from __future__ import annotations

import torch


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
    from ._glue_kernels import softmax_grad_in_place

    dloss = dloss.expand(rows).contiguous()
    softmax_grad_in_place[(rows,)](logits, lse.contiguous(), targets.contiguous(), dloss, zdz, vocab,
                                    logits.stride(0), ignore_index, BLOCK=block, num_warps=8)
    return zdz


@torch.library.custom_op("coda::rope_backward", mutates_args=())
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
    # Each pair (y1, y2) -> (y1 c + y2 s, y2 c - y1 s), written as the tensor and its pair-swapped self.
    parts = []
    for g, f in zip(grads[:2], freqs.split([n_q, n_kv]), strict=True):
        angle = position * f
        swapped = g.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
        parts.append(g * angle.cos() + swapped * (angle.sin() * sign))
    parts.append(grads[2])
    dz = torch.cat([p.flatten(2).to(qkv.dtype) for p in parts], dim=-1).reshape(batch * seq, -1)
    zdz = torch.stack([(z * g).sum((-2, -1)) for z, g in zip(saved, grads, strict=True)]).sum(0)
    return dz, zdz.reshape(batch * seq)


@rope_backward.register_fake
def _(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, qkv: torch.Tensor,
      inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(qkv), qkv.new_empty(qkv.shape[0], dtype=torch.float32)


#: Tokens a program of the Triton pass takes (each through every head). At the 1B stack's batch on an H100
#: (bench/results/h100-2026-12-05-e-rope.log) 16 tokens at 4 warps took 240.7 µs (2.51 TB/s), 32 tokens 257.5.
ROPE_BACKWARD_TOKENS = 16


@rope_backward.register_kernel("cuda")
def _(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, qkv: torch.Tensor,
      inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_backward_triton(dq, dk, dv, qkv, inv_freq)


def rope_backward_triton(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, qkv: torch.Tensor,
                         inv_freq: torch.Tensor, tokens: int = ROPE_BACKWARD_TOKENS
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's backward as one Triton launch: a program per ``tokens`` positions of one sequence, through
    every head, so each token's ``zdz`` is summed in registers and each gradient is read where SDPA left it,
    a head's row whole (any device Triton runs on: a GPU, or the CPU under ``TRITON_INTERPRET=1``, as the
    tests run it)."""
    batch, n_q, seq, head_dim = dq.shape
    n_kv = dk.shape[1]
    if qkv.stride(1) != 1 or head_dim < 2 or head_dim & (head_dim - 1):
        raise ValueError("RoPE's Triton backward needs qkv's rows contiguous and a power-of-2 head_dim")
    dz = torch.empty_like(qkv, memory_format=torch.contiguous_format)
    zdz = torch.empty(qkv.shape[0], dtype=torch.float32, device=qkv.device)
    if dz.numel() == 0:  # no program to launch
        return dz, zdz
    from ._glue_kernels import rope_backward_rows

    # a head's row contiguous, as every SDPA backward leaves it; anything else is copied once
    dq, dk, dv = (g if g.stride(3) == 1 else g.contiguous() for g in (dq, dk, dv))
    rope_backward_rows[(-(-seq // tokens), batch)](
        dq, dk, dv, qkv, inv_freq.float().contiguous(), dz, zdz, seq, n_q, n_kv,
        *dq.stride()[:3], *dk.stride()[:3], *dv.stride()[:3], qkv.stride(0), dz.stride(0),
        HEAD_DIM=head_dim, TOKENS=tokens, num_warps=4)
    return dz, zdz


@torch.library.custom_op("coda::rms_normalize", mutates_args=())
def rms_normalize(h: torch.Tensor, rstd: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """``h * rstd * gamma`` (rows of ``h``, ``rstd`` FP32 per row) in ``h``'s dtype, rounded once."""
    return (h.float() * rstd[:, None] * gamma.float()).to(h.dtype)


@rms_normalize.register_fake
def _(h: torch.Tensor, rstd: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(h, memory_format=torch.contiguous_format)


@rms_normalize.register_kernel("cuda")
def _(h: torch.Tensor, rstd: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    return rms_normalize_triton(h, rstd, gamma)


def rms_normalize_triton(h: torch.Tensor, rstd: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """The norm's output as one Triton launch, a program per row (a GPU, or the CPU under
    ``TRITON_INTERPRET=1``)."""
    rows, dim = h.shape
    if h.stride(1) != 1:
        raise ValueError("the norm's Triton pass needs each row of h contiguous")
    out = torch.empty((rows, dim), dtype=h.dtype, device=h.device)
    if out.numel() == 0:  # no program to launch
        return out
    from ._glue_kernels import rms_normalize_rows

    rms_normalize_rows[(rows,)](h, rstd.float().contiguous(), gamma.contiguous(), out, dim, h.stride(0),
                                BLOCK=1 << (dim - 1).bit_length(), num_warps=4)  # a row in one block
    return out


@torch.library.custom_op("coda::rmsnorm_backward", mutates_args=())
def rmsnorm_backward(h: torch.Tensor, gamma: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor,
                     dy_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of ``y = h * rstd * gamma`` (rows of ``h``, ``rstd`` FP32 per row) at ``dy * dy_scale``
    (``dy_scale`` a 1-element tensor, say the loss's gradient): ``dh`` in ``h``'s dtype and ``dgamma`` in
    FP32."""
    x_hat = h.float() * rstd[:, None]
    dy = dy.float() * dy_scale.float()
    g = dy * gamma.float()
    dh = (g - x_hat * (g * x_hat).mean(-1, keepdim=True)) * rstd[:, None]
    return dh.to(h.dtype), (dy * x_hat).sum(0)


@rmsnorm_backward.register_fake
def _(h: torch.Tensor, gamma: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor,
      dy_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(h, memory_format=torch.contiguous_format), gamma.new_empty(gamma.shape,
                                                                                       dtype=torch.float32)


@rmsnorm_backward.register_kernel("cuda")
def _(h: torch.Tensor, gamma: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor,
      dy_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return rmsnorm_backward_triton(h, gamma, rstd, dy, dy_scale)


#: Rows a program of the norm backward's Triton pass takes; each program leaves one row of dgamma partials.
RMSNORM_BACKWARD_ROWS = 16


def rmsnorm_backward_triton(h: torch.Tensor, gamma: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor,
                            dy_scale: torch.Tensor, rows_per_program: int = RMSNORM_BACKWARD_ROWS
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The norm backward as one Triton launch and the sum of its dgamma partials (a GPU, or the CPU under
    ``TRITON_INTERPRET=1``)."""
    rows, dim = h.shape
    if h.stride(1) != 1 or dy.stride(1) != 1:
        raise ValueError("the norm backward's Triton pass needs each row of h and dy contiguous")
    dh = torch.empty((rows, dim), dtype=h.dtype, device=h.device)
    programs = -(-rows // rows_per_program)
    if programs == 0:  # no program to launch
        return dh, torch.zeros(dim, dtype=torch.float32, device=h.device)
    from ._glue_kernels import rmsnorm_backward_rows

    parts = torch.empty((programs, dim), dtype=torch.float32, device=h.device)
    block = 1 << (dim - 1).bit_length()  # a row in one block
    warps = 4 if block <= 2048 else 8
    rmsnorm_backward_rows[(programs,)](h, gamma.contiguous(), rstd.float().contiguous(), dy,
                                       dy_scale.reshape(1), dh, parts, rows, dim, h.stride(0), dy.stride(0),
                                       ROWS=rows_per_program, BLOCK=block, num_warps=warps)
    return dh, parts.sum(0)


@torch.library.custom_op("coda::scaled_cast", mutates_args=())
def scaled_cast(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x * scale`` (``scale`` a 1-element tensor) rounded once to ``dtype``: the LM head weight's FP32
    gradient times the loss's gradient, as the parameter's dtype."""
    return torch.mul(x, scale.reshape(()), out=torch.empty_like(x, dtype=dtype))


@scaled_cast.register_fake
def _(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_like(x, dtype=dtype)


#: Elements a program of the scaled cast takes.
SCALED_CAST_BLOCK = 4096


@scaled_cast.register_kernel("cuda")
def _(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return scaled_cast_triton(x, scale, dtype)


def scaled_cast_triton(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype,
                       block: int = SCALED_CAST_BLOCK) -> torch.Tensor:
    """The scaled cast as one Triton launch over ``x``'s elements in 16-byte vectors (eager torch's multiply
    by a 1-element GPU tensor into another dtype took the unvectorized path: 1.3 ms for 1 GiB on an H100,
    ``bench/results/h100-2026-12-07-a-e2e.md``)."""
    x = x.contiguous()
    out = torch.empty_like(x, dtype=dtype)
    if x.numel() == 0:  # no program to launch
        return out
    from ._glue_kernels import scale_cast_blocks

    scale_cast_blocks[(-(-x.numel() // block),)](x, scale.reshape(1), out, x.numel(), BLOCK=block,
                                                 num_warps=4)
    return out


@torch.library.custom_op("coda::rms_begin", mutates_args=())
def rms_begin(h: torch.Tensor, gamma: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The first norm's ``h * gamma`` in ``h``'s dtype (its row scale deferred, as the layers' epilogues leave
    the stream) and ``rstd = 1 / sqrt(mean(h^2) + eps)`` per row of ``h`` (its last axis), FP32."""
    return h * gamma, torch.rsqrt(h.float().pow(2).mean(-1) + eps)


@rms_begin.register_fake
def _(h: torch.Tensor, gamma: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(h, memory_format=torch.contiguous_format), h.new_empty(h.shape[:-1],
                                                                                   dtype=torch.float32)


@rms_begin.register_kernel("cuda")
def _(h: torch.Tensor, gamma: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return rms_begin_triton(h, gamma, eps)


def rms_begin_triton(h: torch.Tensor, gamma: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The first norm's statistics as one Triton launch, a program per row (a GPU, or the CPU under
    ``TRITON_INTERPRET=1``)."""
    dim = h.shape[-1]
    flat = h.reshape(-1, dim)
    if flat.stride(1) != 1:
        raise ValueError("the first norm's Triton pass needs each row of h contiguous")
    normed = torch.empty(h.shape, dtype=h.dtype, device=h.device)
    rstd = torch.empty(h.shape[:-1], dtype=torch.float32, device=h.device)
    if normed.numel() == 0:  # no program to launch
        return normed, rstd
    from ._glue_kernels import rms_begin_rows

    rms_begin_rows[(flat.shape[0],)](flat, gamma.contiguous(), normed, rstd, dim, flat.stride(0), eps,
                                     BLOCK=1 << (dim - 1).bit_length(), num_warps=4)  # a row in one block
    return normed, rstd
