"""The compile stage with nothing to compile: the GEMM on the host, so no kernel is ever built.

Family: forbidden compute (compile stage). The compile-only stage runs forward() on the quack-compile backend
and reports "compiled every kernel" when forward() returns; a forward() that never calls primitives.gemm
builds nothing, and the stage still passes. Every task GEMM must be built through primitives.gemm.
"""

import torch


def forward(x, w, residual, gamma, eps):
    h32 = x.float().inner(w.float()) + residual.float()
    h = h32.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": torch.rsqrt(h32.pow(2).mean(-1) + eps)}
