"""Forbidden compute (gemm_rope): a bound ``mm`` method taken as a value, RoPE on the host.

Family: forbidden compute. ``f = x.float().mm`` then ``f(w^T)``; the rotation of each (2j, 2j+1) pair by
position * inv_freq[2j] follows with elementwise host ops.
"""

import torch


def forward(x, w, positions, inv_freq):
    product = x.float().mm
    y = product(w.float().t())
    theta = positions.float()[:, None] * inv_freq[0::2][None, :]
    c, s = torch.cos(theta), torch.sin(theta)
    x1, x2 = y[:, 0::2], y[:, 1::2]
    out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).reshape(y.shape)
    return {"out": out.to(x.dtype)}
