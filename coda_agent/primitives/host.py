"""Small host-side helpers for auxiliary reductions between GEMMs (tiny (M,) tensors, few kernels)."""

from __future__ import annotations

import torch


def rstd_from_sqsum(sqsum: torch.Tensor, n: int, eps: float) -> torch.Tensor:
    """RMSNorm reciprocal std from a row's sum of squares: ``rsqrt(sqsum / n + eps)`` in FP32 (two small
    kernels)."""
    return torch.add(eps, sqsum.float(), alpha=1.0 / n).rsqrt_()


def rstd_correction(dot: torch.Tensor, rstd: torch.Tensor, n: int) -> torch.Tensor:
    """RMSNorm-backward correction per row: ``-(rstd**3 / n) * dot`` with dot = sum_n(dy * y).

    With y the un-normalised row and dy the gradient w.r.t. y * rstd, dx = rstd * dy + y * correction.
    """
    r = rstd.float()
    return -(r * r * r / n) * dot.float()
