"""Forbidden compute: ``from torch import matmul as combine`` (the function under an innocent name).

Family: forbidden compute (aliases). A check that watches ``torch.<name>`` attributes never sees
``combine(...)``.
"""

import torch
from torch import matmul as combine


def forward(x, w, residual, gamma, eps):
    h32 = combine(x.float(), w.float().t()) + residual.float()
    h = h32.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": torch.rsqrt(h32.pow(2).mean(-1) + eps)}
