"""RoPE's backward (torch/glue.py) at the 1B stack's batch on the GPU: the Triton kernel as shipped, at other
token blocks and warp counts, against its first version (pair-strided 2-byte accesses, 2.39 ms a layer in the
end-to-end bench on the H200, bench/results/h200-2026-12-05-c-e2e.md) and Inductor's build of the eager math
(1.08 ms a layer there at 63f307a). Each variant is checked against the eager op first.

    source .gpu2/env.sh && python3 bench/probes/rope_backward_probe.py
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

from coda_agent.bench.e2e import PRESETS
from coda_agent.torch import glue, rope_table
from coda_agent.torch._glue_kernels import rope_backward_rows


@triton.jit
def _first_head(grad_ptr, s_b, s_h, s_s, s_d, head, col0, qkv_ptr, dz_ptr, freq_ptr, b, s, inside,
                tokens, qkv_row, dz_row, ROTATE: tl.constexpr, HEAD_DIM: tl.constexpr):
    lane = tl.arange(0, HEAD_DIM // 2) * 2
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
def first_rope_backward_rows(dq_ptr, dk_ptr, dv_ptr, qkv_ptr, freq_ptr, dz_ptr, zdz_ptr, seq, n_q, n_kv,
                             q_b, q_h, q_s, q_d, k_b, k_h, k_s, k_d, v_b, v_h, v_s, v_d, qkv_row, dz_row,
                             HEAD_DIM: tl.constexpr, TOKENS: tl.constexpr):
    """The kernel as 1a01096 shipped it."""
    b = tl.program_id(1)
    s = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    inside = s < seq
    tokens = b * seq + s
    acc = tl.zeros([TOKENS], dtype=tl.float32)
    for h in range(0, n_q):
        acc += _first_head(dq_ptr, q_b, q_h, q_s, q_d, h, h * HEAD_DIM, qkv_ptr, dz_ptr, freq_ptr,
                           b, s, inside, tokens, qkv_row, dz_row, True, HEAD_DIM)
    for h in range(0, n_kv):
        acc += _first_head(dk_ptr, k_b, k_h, k_s, k_d, h, (n_q + h) * HEAD_DIM, qkv_ptr, dz_ptr,
                           freq_ptr, b, s, inside, tokens, qkv_row, dz_row, True, HEAD_DIM)
    for h in range(0, n_kv):
        acc += _first_head(dv_ptr, v_b, v_h, v_s, v_d, h, (n_q + n_kv + h) * HEAD_DIM, qkv_ptr, dz_ptr,
                           freq_ptr, b, s, inside, tokens, qkv_row, dz_row, False, HEAD_DIM)
    tl.store(zdz_ptr + tokens, acc, mask=inside)


def case(batch: int, seq: int, n_q: int, n_kv: int, head_dim: int):
    """SDPA's layouts: each gradient a (B, heads, S, d) view of a (B, S, heads, d) tensor."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def grad(heads):
        return torch.randn(batch, seq, heads, head_dim, device="cuda", generator=g,
                           dtype=torch.bfloat16).transpose(1, 2)

    qkv = torch.randn(batch * seq, (n_q + 2 * n_kv) * head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    inv_freq = rope_table(head_dim, n_q, n_kv, 500000.0).cuda()
    return grad(n_q), grad(n_kv), grad(n_kv), qkv, inv_freq


def shipped(tokens: int, warps: int):
    def run(dq, dk, dv, qkv, inv_freq):
        batch, n_q, seq, head_dim = dq.shape
        dz = torch.empty_like(qkv)
        zdz = torch.empty(qkv.shape[0], dtype=torch.float32, device=qkv.device)
        rope_backward_rows[(-(-seq // tokens), batch)](
            dq, dk, dv, qkv, inv_freq.float().contiguous(), dz, zdz, seq, n_q, dk.shape[1],
            *dq.stride()[:3], *dk.stride()[:3], *dv.stride()[:3], qkv.stride(0), dz.stride(0),
            HEAD_DIM=head_dim, TOKENS=tokens, num_warps=warps)
        return dz, zdz
    return run


def first(dq, dk, dv, qkv, inv_freq, tokens=32):
    batch, n_q, seq, head_dim = dq.shape
    dz = torch.empty_like(qkv)
    zdz = torch.empty(qkv.shape[0], dtype=torch.float32, device=qkv.device)
    first_rope_backward_rows[(-(-seq // tokens), batch)](
        dq, dk, dv, qkv, inv_freq.float().contiguous(), dz, zdz, seq, n_q, dk.shape[1],
        *dq.stride(), *dk.stride(), *dv.stride(), qkv.stride(0), dz.stride(0),
        HEAD_DIM=head_dim, TOKENS=tokens, num_warps=4)
    return dz, zdz


def time_us(fn, args, reps: int) -> list[float]:
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn(*args)
    out = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="1b", choices=PRESETS, help="the end-to-end bench's model and batch")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    m = PRESETS[a.preset]
    n_q, n_kv, head_dim = m.n_heads, m.n_kv_heads, m.dim // m.n_heads
    args = case(m.batch, m.seq, n_q, n_kv, head_dim)
    nbytes = sum(t.numel() * t.element_size() for t in args[:4]) * 1 + args[3].numel() * 2 + args[3].shape[0] * 4
    want_dz, want_zdz = glue.rope_backward._init_fn(*args)  # the eager math
    variants = {"first version (1a01096)": first,
                "inductor (eager math compiled)": torch.compile(glue.rope_backward._init_fn)}
    for tokens in (16, 32, 64):
        for warps in (4, 8):
            label = f"shipped kernel, {tokens} tokens, {warps} warps"
            if tokens == glue.ROPE_BACKWARD_TOKENS and warps == 4:
                label += " (the default)"
            variants[label] = shipped(tokens, warps)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"B {m.batch} S {m.seq} heads {[n_q, n_kv]} d {head_dim}; {nbytes / 1e6:.0f} MB moved a call")
    rows = []
    for label, fn in variants.items():
        dz, zdz = fn(*args)
        dz_err = ((dz.float() - want_dz.float()).abs().max() / want_dz.float().abs().max()).item()
        zdz_err = ((zdz - want_zdz).abs().max() / want_zdz.abs().max()).item()
        times = time_us(fn, args, a.reps)
        med = statistics.median(times)
        rows.append({"variant": label, "median_us": med, "min_us": min(times), "dz_rel_err": dz_err,
                     "zdz_rel_err": zdz_err, "tb_s": nbytes / med / 1e6})
        print(f"{med:9.1f} us (min {min(times):8.1f})  {nbytes / med / 1e6:5.2f} TB/s  dz err {dz_err:.2e}  "
              f"zdz err {zdz_err:.2e}  {label}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
