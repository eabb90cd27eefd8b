"""Forbidden compute: ``torch.matmul`` through an attribute chain (``torch.serialization.torch.matmul``).

Family: forbidden compute / torch re-exports. ``torch.serialization`` holds the ``torch`` module as an
attribute, so ``torch.serialization.torch.matmul`` is ``torch.matmul``; a check that tests only the first
attribute after ``torch`` (``serialization``) lets it through, and taking it as a value avoids ``.matmul(``.
"""

import torch


def forward(x, w, residual, gamma, eps):
    mm = torch.serialization.torch.matmul
    h32 = mm(x.float(), w.float().t()) + residual.float()
    h = h32.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": torch.rsqrt(h32.pow(2).mean(-1) + eps)}
