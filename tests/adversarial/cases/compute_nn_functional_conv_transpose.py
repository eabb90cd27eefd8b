"""Forbidden compute: ``torch.nn.functional.conv_transpose1d`` (the functional spelling of the same trick).

Family: forbidden compute. A 1-wide transposed convolution over K input channels is the GEMM.
"""

import torch


def forward(x, w, residual, gamma, eps):
    y = torch.nn.functional.conv_transpose1d(x.float().unsqueeze(-1), w.float().t().unsqueeze(-1))
    h32 = y.squeeze(-1) + residual.float()
    h = h32.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": torch.rsqrt(h32.pow(2).mean(-1) + eps)}
