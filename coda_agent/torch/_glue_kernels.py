"""The Triton kernels of :mod:`.glue`'s GPU passes: imported only when one runs (Triton loads on first use,
and a CPU-only install may lack it). A kernel's name is what a profiler's kernel table shows."""

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


@triton.jit
def rope_backward_head(grad_ptr, s_b, s_h, s_s, s_d, head, col0, qkv_ptr, dz_ptr, freq_ptr, b, s, inside,
                       tokens, qkv_row, dz_row, ROTATE: tl.constexpr, HEAD_DIM: tl.constexpr):
    """One head's [TOKENS, HEAD_DIM] tile: its pairs rotated back into dz; its share of zdz returned."""
    lane = tl.arange(0, HEAD_DIM // 2) * 2  # the even lane of each pair
    mask = inside[:, None]
    at = grad_ptr + b.to(tl.int64) * s_b + head * s_h + s[:, None].to(tl.int64) * s_s
    even = tl.load(at + lane[None, :] * s_d, mask=mask, other=0.0).to(tl.float32)
    odd = tl.load(at + (lane[None, :] + 1) * s_d, mask=mask, other=0.0).to(tl.float32)
    rows = tokens[:, None].to(tl.int64)
    cols = col0 + lane[None, :]
    if ROTATE:
        angle = s[:, None].to(tl.float32) * tl.load(freq_ptr + col0 + lane)[None, :]
        c, sn = tl.cos(angle), tl.sin(angle)
        out_even, out_odd = even * c + odd * sn, odd * c - even * sn
    else:
        out_even, out_odd = even, odd
    dz_ty = dz_ptr.dtype.element_ty
    tl.store(dz_ptr + rows * dz_row + cols, out_even.to(dz_ty), mask=mask)
    tl.store(dz_ptr + rows * dz_row + cols + 1, out_odd.to(dz_ty), mask=mask)
    z_even = tl.load(qkv_ptr + rows * qkv_row + cols, mask=mask, other=0.0).to(tl.float32)
    z_odd = tl.load(qkv_ptr + rows * qkv_row + cols + 1, mask=mask, other=0.0).to(tl.float32)
    return tl.sum(even * z_even + odd * z_odd, axis=1)

@triton.jit
def rope_backward_rows(dq_ptr, dk_ptr, dv_ptr, qkv_ptr, freq_ptr, dz_ptr, zdz_ptr, seq, n_q, n_kv,
                       q_b, q_h, q_s, q_d, k_b, k_h, k_s, k_d, v_b, v_h, v_s, v_d, qkv_row, dz_row,
                       HEAD_DIM: tl.constexpr, TOKENS: tl.constexpr):
    b = tl.program_id(1)
    s = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    inside = s < seq
    tokens = b * seq + s
    acc = tl.zeros([TOKENS], dtype=tl.float32)
    for h in range(0, n_q):
        acc += rope_backward_head(dq_ptr, q_b, q_h, q_s, q_d, h, h * HEAD_DIM, qkv_ptr, dz_ptr, freq_ptr,
                                  b, s, inside, tokens, qkv_row, dz_row, True, HEAD_DIM)
    for h in range(0, n_kv):
        acc += rope_backward_head(dk_ptr, k_b, k_h, k_s, k_d, h, (n_q + h) * HEAD_DIM, qkv_ptr, dz_ptr,
                                  freq_ptr, b, s, inside, tokens, qkv_row, dz_row, True, HEAD_DIM)
    for h in range(0, n_kv):
        col0 = (n_q + n_kv + h) * HEAD_DIM
        acc += rope_backward_head(dv_ptr, v_b, v_h, v_s, v_d, h, col0, qkv_ptr, dz_ptr, freq_ptr, b, s,
                                  inside, tokens, qkv_row, dz_row, False, HEAD_DIM)
    tl.store(zdz_ptr + tokens, acc, mask=inside)
