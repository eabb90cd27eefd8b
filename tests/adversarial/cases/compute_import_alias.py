"""Forbidden compute: ``import torch as T`` and ``T.einsum`` (a checker keyed on the text ``torch.`` misses
it).

Family: forbidden compute (aliases). A naive check greps for ``torch.matmul``/``torch.einsum`` or only
tracks the name ``torch``; the alias ``T`` is the same module.
"""

import torch as T


def forward(x, w, residual, gamma, eps):
    h32 = T.einsum("mk,nk->mn", x.float(), w.float()) + residual.float()
    h = h32.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": T.rsqrt(h32.pow(2).mean(-1) + eps)}
