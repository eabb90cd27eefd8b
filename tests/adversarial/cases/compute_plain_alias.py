"""Forbidden compute: ``T = torch`` at module level, then ``T.matmul`` (the module under another name).

Family: forbidden compute (aliases). A check that looks for ``torch.matmul`` by the name ``torch`` misses
``T.matmul``; taken as a value (``mm = T.matmul``), it is not even an attribute call of ``matmul``.
"""

import torch

T = torch


def forward(x, w, residual, gamma, eps):
    mm = T.matmul
    h32 = mm(x.float(), w.float().t()) + residual.float()
    h = h32.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": T.rsqrt(h32.pow(2).mean(-1) + eps)}
