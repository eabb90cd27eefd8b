"""Forbidden compute: the GEMM as a 1-wide transposed convolution (``torch.conv_transpose1d``).

Family: forbidden compute. With x as M batches of K channels of length 1 and w^T as a (K, N, 1) kernel, a
transposed convolution is exactly x @ w^T. ``conv1d``/``conv2d`` are on the deny list;
``conv_transpose1d`` is not.
"""

import torch


def forward(x, w, residual, gamma, eps):
    y = torch.conv_transpose1d(x.float().unsqueeze(-1), w.float().t().unsqueeze(-1))
    h32 = y.squeeze(-1) + residual.float()
    h = h32.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": torch.rsqrt(h32.pow(2).mean(-1) + eps)}
