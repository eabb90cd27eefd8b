"""Bad candidate: the GEMM through torch.linalg.multi_dot (cuBLAS); refused statically and caught by the kernel trace."""

import torch


def forward(x, w, residual, gamma, eps):
    h = torch.linalg.multi_dot([x, w.t()]) + residual
    rstd = torch.rsqrt(h.float().pow(2).mean(-1) + eps)
    return {"h": h, "normed": h * gamma, "rstd": rstd}
