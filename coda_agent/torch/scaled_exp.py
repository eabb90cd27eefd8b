"""The LM head's cross-entropy through QuACK's scaled-exp pipeline (issue 45, item 1): its forward runs every
GEMM of the head, and the logits are never stored.

``quack.linear_cross_entropy``'s scaled-exp form takes the head in chunks of rows. Per chunk, the logits
GEMM's epilogue writes ``E = 2^(z log2 e - k)`` with a power-of-two offset ``k`` per row and column tile (plus
the tile's sum of exponentials and the target's logit); a Triton pass turns those into the loss, the target's
correction and per-row scales; then ``dx`` and ``dW`` are two GEMMs whose A operand is ``E`` rescaled on its
way into the tensor cores. The backward only multiplies by ``dloss``. Against the chain's own head (logits
kept, one softmax-gradient pass, two GEMMs on the stored dlogits) it saves the pass over M x V values and, in
chunks, the M x V buffer; it costs a separate RMSNorm forward and backward (:mod:`.glue`, memory-bound, M x
D), since QuACK's GEMMs take the normalized rows and give their gradient.

``scaled_exp_cross_entropy`` is a custom op (``torch.ops.coda``), so a caller's torch.compile keeps it whole.
On a CPU (the emulator's world, tests) it is the same math in FP32 torch, unchunked.
"""

from __future__ import annotations

import torch

#: The logits a chunk must stay under: QuACK's Triton glue indexes a chunk's values in int32 (a chunk of 32768
#: rows at V 128256 faulted on the H100, bench/results/h100-2026-12-06-h-notes.md).
CHUNK_LOGITS_LIMIT = 2**31


@torch.library.custom_op("coda::scaled_exp_cross_entropy", mutates_args=())
def scaled_exp_cross_entropy(x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor,
                             grad_scale: torch.Tensor, ignore_index: int,
                             chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row losses (M, FP32), ``dx`` (M, D, x's dtype) and ``dW`` (V, D, FP32) of the cross-entropy of
    ``x @ w.T`` against ``targets``, the gradients scaled by ``grad_scale`` (an FP32 scalar tensor, e.g. one
    over the counted rows); a row whose target is ``ignore_index`` has zero loss and zero gradients.
    ``chunk`` is the rows per chunk on a GPU (a multiple of 128)."""
    z = x.float() @ w.float().t()
    counted = targets != ignore_index
    safe = torch.where(counted, targets, 0)
    lse = torch.logsumexp(z, dim=-1)
    loss = torch.where(counted, lse - z.gather(1, safe[:, None]).squeeze(1), 0.0)
    onehot = torch.nn.functional.one_hot(safe, z.shape[1]).float()
    dz = (torch.softmax(z, dim=-1) - onehot) * torch.where(counted, grad_scale.float(), 0.0)[:, None]
    return loss, (dz @ w.float()).to(x.dtype), dz.t() @ x.float()


@scaled_exp_cross_entropy.register_fake
def _(x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, grad_scale: torch.Tensor, ignore_index: int,
      chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (x.new_empty(x.shape[0], dtype=torch.float32), torch.empty_like(x),
            w.new_empty(w.shape, dtype=torch.float32))


@scaled_exp_cross_entropy.register_kernel("cuda")
def _(x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, grad_scale: torch.Tensor, ignore_index: int,
      chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from quack.linear_cross_entropy import scaled_exp_lce_supported, scaled_exp_linear_cross_entropy_fwd

    if not scaled_exp_lce_supported(x, w, chunk, "mean"):
        raise ValueError(f"QuACK's scaled-exp cross-entropy does not take this head (it needs an SM90 GPU, "
                         f"bf16, a vocabulary of a multiple of 128 and chunks of a multiple of 128 rows): x "
                         f"{tuple(x.shape)} {x.dtype}, w {tuple(w.shape)} {w.dtype}, chunk {chunk}")
    rows, dim = x.shape
    chunk, pad = chunking(rows, dim, w.shape[0], chunk)
    if pad:
        x = torch.cat([x, x.new_zeros(pad, dim)])
        targets = torch.cat([targets, targets.new_full((pad,), ignore_index)])
    loss, dx, dw = scaled_exp_linear_cross_entropy_fwd(x, w, targets, chunk, ignore_index,
                                                       grad_scale=grad_scale.float().reshape(()))
    assert dx is not None and dw is not None  # both asked for
    return loss[:rows], dx[:rows], dw  # past `rows`: padding


def chunking(rows: int, dim: int, vocab: int, chunk: int) -> tuple[int, int]:
    """The chunk QuACK's pipeline gets for ``chunk`` asked for, and the ignored rows to add after the last.

    Its dx epilogue takes the per-row scale as a row or a column vector by shape and refuses a chunk of
    ``dim`` rows (it cannot tell them apart). Such a chunk doubles where the doubled one stays under the
    glue's limit, else loses 128 rows. Growing it by a tile row, as 4096 rows at the 8B head's D 4096 first
    did, gave its dx GEMM 33 rows of 128x256 tiles in 2x1 clusters, 544 tile slots, just past 4 waves of 132
    SMs: that GEMM ran 28.3 ms where the 1B head's, as many FLOPs at 32 rows, took 22.8 (h100-2026-12-06-h). A
    last chunk that would have ``dim`` rows gets 128 more whose target is ignored (no loss, no gradient). Its
    Triton glue indexes a chunk's values in int32: a chunk of 2^31 logits or more is refused."""
    if chunk == dim:
        chunk = 2 * chunk if 2 * chunk * vocab < CHUNK_LOGITS_LIMIT else chunk - 128
    last = rows - (-(-rows // chunk) - 1) * chunk
    pad = 128 if -(-last // 128) * 128 == dim else 0
    used = min(chunk, -(-(rows + pad) // 128) * 128)  # the rows of the largest chunk QuACK runs
    if used * vocab >= CHUNK_LOGITS_LIMIT:
        most = (CHUNK_LOGITS_LIMIT - 1) // vocab
        raise ValueError(f"a chunk of {used} rows of a {vocab}-column vocabulary passes 2^31 logits, which "
                         f"QuACK's scaled-exp glue cannot index: take at most {most} rows a chunk")
    return chunk, pad
