"""Forbidden compute: the GEMM as a broadcast multiply and a sum, ``(x[:, None, :] * w[None]).sum(-1)``.

Family: forbidden compute. Only elementwise and reduction ops, no matmul name anywhere: an (M, N, K)
product tensor summed over K. Correct to FP32 rounding; on a GPU a huge elementwise kernel plus a reduction.
"""

import torch


def forward(x, w, residual, gamma, eps):
    h32 = (x.float()[:, None, :] * w.float()[None, :, :]).sum(-1) + residual.float()
    h = h32.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": torch.rsqrt(h32.pow(2).mean(-1) + eps)}
