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
def rope_backward_head(grad_ptr, s_b, s_h, s_s, head, col0, qkv_ptr, dz_ptr, freq_ptr, b, s, inside, tokens,
                       qkv_row, dz_row, ROTATE: tl.constexpr, HEAD_DIM: tl.constexpr, TOKENS: tl.constexpr):
    """One head's [TOKENS, HEAD_DIM] tile, rotated back into dz; its share of zdz returned. Every row is read
    and written whole (16-byte accesses), the pairs split in registers: a pair-strided access is a 2-byte one,
    and made the first version of this kernel 2.2x slower than Inductor's (H200, 2026-12-05)."""
    lane = tl.arange(0, HEAD_DIM)
    mask = inside[:, None]
    at = grad_ptr + b.to(tl.int64) * s_b + head * s_h + s[:, None].to(tl.int64) * s_s
    grad = tl.load(at + lane[None, :], mask=mask, other=0.0).to(tl.float32)
    rows = tokens[:, None].to(tl.int64)
    cols = col0 + lane[None, :]
    saved = tl.load(qkv_ptr + rows * qkv_row + cols, mask=mask, other=0.0).to(tl.float32)
    if ROTATE:
        even, odd = tl.split(tl.reshape(grad, (TOKENS, HEAD_DIM // 2, 2)))
        freq = tl.load(freq_ptr + col0 + tl.arange(0, HEAD_DIM // 2) * 2)  # a pair's lanes share one
        angle = s[:, None].to(tl.float32) * freq[None, :]
        c, sn = tl.cos(angle), tl.sin(angle)
        out = tl.reshape(tl.join(even * c + odd * sn, odd * c - even * sn), (TOKENS, HEAD_DIM))
    else:
        out = grad
    tl.store(dz_ptr + rows * dz_row + cols, out.to(dz_ptr.dtype.element_ty), mask=mask)
    return tl.sum(grad * saved, axis=1)


@triton.jit
def rope_backward_rows(dq_ptr, dk_ptr, dv_ptr, qkv_ptr, freq_ptr, dz_ptr, zdz_ptr, seq, n_q, n_kv,
                       q_b, q_h, q_s, k_b, k_h, k_s, v_b, v_h, v_s, qkv_row, dz_row,
                       HEAD_DIM: tl.constexpr, TOKENS: tl.constexpr):
    b = tl.program_id(1)
    s = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    inside = s < seq
    tokens = b * seq + s
    acc = tl.zeros([TOKENS], dtype=tl.float32)
    for h in range(0, n_q):
        acc += rope_backward_head(dq_ptr, q_b, q_h, q_s, h, h * HEAD_DIM, qkv_ptr, dz_ptr, freq_ptr, b, s,
                                  inside, tokens, qkv_row, dz_row, True, HEAD_DIM, TOKENS)
    for h in range(0, n_kv):
        acc += rope_backward_head(dk_ptr, k_b, k_h, k_s, h, (n_q + h) * HEAD_DIM, qkv_ptr, dz_ptr, freq_ptr,
                                  b, s, inside, tokens, qkv_row, dz_row, True, HEAD_DIM, TOKENS)
    for h in range(0, n_kv):
        acc += rope_backward_head(dv_ptr, v_b, v_h, v_s, h, (n_q + n_kv + h) * HEAD_DIM, qkv_ptr, dz_ptr,
                                  freq_ptr, b, s, inside, tokens, qkv_row, dz_row, False, HEAD_DIM, TOKENS)
    tl.store(zdz_ptr + tokens, acc, mask=inside)


@triton.jit
def rms_normalize_rows(h_ptr, rstd_ptr, gamma_ptr, out_ptr, dim, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < dim
    h = tl.load(h_ptr + row.to(tl.int64) * row_stride + cols, mask=inside, other=0.0).to(tl.float32)
    gamma = tl.load(gamma_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    out = h * tl.load(rstd_ptr + row) * gamma
    tl.store(out_ptr + row.to(tl.int64) * dim + cols, out.to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def rms_begin_rows(h_ptr, gamma_ptr, normed_ptr, rstd_ptr, dim, row_stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < dim
    h = tl.load(h_ptr + row.to(tl.int64) * row_stride + cols, mask=inside, other=0.0).to(tl.float32)
    gamma = tl.load(gamma_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(rstd_ptr + row, 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / dim + eps))
    tl.store(normed_ptr + row.to(tl.int64) * dim + cols, (h * gamma).to(normed_ptr.dtype.element_ty),
             mask=inside)


@triton.jit
def scale_cast_blocks(x_ptr, scale_ptr, out_ptr, n, BLOCK: tl.constexpr):
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = at < n
    x = tl.load(x_ptr + at, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + at, (x * tl.load(scale_ptr).to(tl.float32)).to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def rmsnorm_backward_rows(h_ptr, gamma_ptr, rstd_ptr, dy_ptr, scale_ptr, dh_ptr, dgamma_part_ptr, rows, dim,
                          h_row, dy_row, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """``ROWS`` rows a program; its share of dgamma goes to a row of ``dgamma_part`` (summed after)."""
    part = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < dim
    gamma = tl.load(gamma_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr).to(tl.float32)
    dgamma = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(ROWS):
        row = part * ROWS + i
        live = inside & (row + cols * 0 < rows)  # a vector: the interpreter takes no scalar in a mask
        r = tl.load(rstd_ptr + tl.minimum(row, rows - 1))  # past the last row: masked off below
        x_hat = tl.load(h_ptr + row.to(tl.int64) * h_row + cols, mask=live, other=0.0).to(tl.float32) * r
        dy = tl.load(dy_ptr + row.to(tl.int64) * dy_row + cols, mask=live, other=0.0).to(tl.float32) * scale
        g = dy * gamma
        dh = (g - x_hat * (tl.sum(g * x_hat, axis=0) / dim)) * r
        tl.store(dh_ptr + row.to(tl.int64) * dim + cols, dh.to(dh_ptr.dtype.element_ty), mask=live)
        dgamma += dy * x_hat
    tl.store(dgamma_part_ptr + part.to(tl.int64) * dim + cols, dgamma, mask=inside)
