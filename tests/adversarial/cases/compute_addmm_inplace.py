"""Forbidden compute: ``Tensor.addmm_`` (the in-place method; only ``addmm`` is on the method deny list).

Family: forbidden compute. ``residual.float().addmm_(x, w^T)`` is the residual plus the GEMM, in one call.
"""

import torch


def forward(x, w, residual, gamma, eps):
    h32 = residual.float().addmm_(x.float(), w.float().t())
    h = h32.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": torch.rsqrt(h32.pow(2).mean(-1) + eps)}
