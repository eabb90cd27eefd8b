"""Causal GQA attention (torch's SDPA) at the 1B stack's batch, forward and forward + backward, by the layout
q, k and v arrive in and by backend (issue 45). CODA's layer hands SDPA (B, heads, S, d) views of the QKV
GEMM's one output (a token stride of (n_q + 2 n_kv) d); torch.compile's graph hands it q and k as RoPE
wrote them. In the 16-layer step on an H100 (results/h100-2026-12-05-f-e2e-16.md) CODA's SDPA forward took
46.0 ms and compile's 42.1: this says whether the layout or the backend is why, and what the gradients'
layout costs.

    source .gpu2/env.sh && python3 bench/probes/sdpa_layout_probe.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from coda_agent.bench.e2e import PRESETS

Qkv = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def layouts(batch: int, seq: int, n_q: int, n_kv: int, head_dim: int, device: str) -> dict[str, Qkv]:
    """The same q, k and v values in each layout, as (B, heads, S, d) tensors."""
    g = torch.Generator(device=device).manual_seed(0)
    qkv = torch.randn(batch * seq, (n_q + 2 * n_kv) * head_dim, device=device, generator=g,
                      dtype=torch.bfloat16)
    q, k, v = qkv.view(batch, seq, n_q + 2 * n_kv, head_dim).split([n_q, n_kv, n_kv], dim=2)
    views = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    tokens_major = tuple(t.contiguous().transpose(1, 2) for t in (q, k, v))
    heads_major = tuple(t.contiguous() for t in views)
    return {"views of one QKV tensor (CODA)": views,
            "each (B, S, heads, d) contiguous": tokens_major,  # type: ignore[dict-item]
            "each (B, heads, S, d) contiguous": heads_major}  # type: ignore[dict-item]


def time_ms(fn: Callable[[], object], reps: int) -> list[float]:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(3):
        fn()
    out = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def row_for(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, backend: SDPBackend | None,
            reference: torch.Tensor | None, reps: int) -> dict[str, object]:
    """One layout on one backend (None: SDPA's own choice): its error against the first row's output, the
    gradients' strides, and its medians."""
    gqa = q.shape[1] != k.shape[1]

    def forward() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    def both() -> None:
        forward().backward(dout)

    try:
        with sdpa_kernel([backend]) if backend else contextlib.nullcontext():
            out = forward()
            out.backward(dout)
            err = 0.0 if reference is None else (out.float() - reference).abs().max().item()
            strides = [list(t.grad.stride()) for t in (q, k, v)]  # type: ignore[union-attr]
            with torch.no_grad():
                fwd = statistics.median(time_ms(forward, reps))
            fwd_bwd = statistics.median(time_ms(both, reps))
    except RuntimeError as e:
        return {"error": str(e).splitlines()[0][:200]}
    finally:
        for t in (q, k, v):
            t.grad = None
    return {"fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd, "bwd_ms": fwd_bwd - fwd, "max_err_vs_first": err,
            "grad_strides": strides, "out": out.detach().float() if reference is None else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="1b", choices=PRESETS, help="the end-to-end bench's model and batch")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default="")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    m = PRESETS[a.preset]
    n_q, n_kv, head_dim = m.n_heads, m.n_kv_heads, m.dim // m.n_heads
    backends = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    name = torch.cuda.get_device_name() if a.device == "cuda" else a.device
    print(f"{name}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
          f"B {m.batch} S {m.seq} heads {[n_q, n_kv]} d {head_dim}, causal")
    # the o-proj's dgrad hands SDPA's backward a (B, heads, S, d) view of a (B, S, heads, d) tensor
    dout = torch.randn(m.batch, m.seq, n_q, head_dim, device=a.device, dtype=torch.bfloat16).transpose(1, 2)
    rows, reference = [], None
    for layout, tensors in layouts(m.batch, m.seq, n_q, n_kv, head_dim, a.device).items():
        q, k, v = (t.detach().requires_grad_() for t in tensors)
        for backend_name, backend in backends.items():
            row = row_for(q, k, v, dout, backend, reference, a.reps)
            out = row.pop("out", None)
            if reference is None and isinstance(out, torch.Tensor):
                reference = out
            if "error" in row:
                print(f"{'':44s}{backend_name:9s} {layout}: {row['error']}")
            else:
                print(f"fwd {row['fwd_ms']:7.3f} ms  fwd+bwd {row['fwd_bwd_ms']:7.3f} ms  err "
                      f"{row['max_err_vs_first']:.1e}  {backend_name:9s} {layout}  "
                      f"grads {row['grad_strides']}")
            rows.append({"layout": layout, "backend": backend_name, **row})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
