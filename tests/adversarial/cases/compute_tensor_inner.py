"""Forbidden compute: the GEMM as ``Tensor.inner`` (no primitives.gemm at all).

Family: forbidden compute that passes the CPU stages. ``x.inner(w)`` contracts the last dims: for
x (M, K) and w (N, K) it is exactly x @ w^T, and ``inner`` is refused only as ``torch.inner``, not as a
method. FP32 on the upcast inputs is as accurate as the reference; on a GPU it is a cuBLAS GEMM.
"""

import torch


def forward(x, w, residual, gamma, eps):
    h32 = x.float().inner(w.float()) + residual.float()
    h = h32.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": torch.rsqrt(h32.pow(2).mean(-1) + eps)}
