"""Bad candidate: a plain torch matmul (the static check rejects it; the GPU trace must too)."""

import torch


def forward(x, w, residual, gamma, eps):
    h = x @ w.t() + residual
    rstd = torch.rsqrt(h.float().pow(2).mean(-1) + eps)
    return {"h": h, "normed": h * gamma, "rstd": rstd}
