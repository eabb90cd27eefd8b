"""Forbidden compute: ``einsum`` through a re-export chain, called directly.

Family: forbidden compute. ``torch.einsum`` is refused; ``torch.serialization.torch.einsum(...)`` is the same
function, and ``einsum`` is not on the method deny list, so even the direct call passes.
"""

import torch


def forward(x, w, residual, gamma, eps):
    h32 = torch.serialization.torch.einsum("mk,nk->mn", x.float(), w.float()) + residual.float()
    h = h32.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": torch.rsqrt(h32.pow(2).mean(-1) + eps)}
