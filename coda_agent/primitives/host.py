"""Small host-side helpers for auxiliary reductions between GEMMs (tiny tensors, one kernel each)."""

from __future__ import annotations

import torch


def rstd_from_sqsum(sqsum: torch.Tensor, n: int, eps: float) -> torch.Tensor:
    """RMSNorm reciprocal std from a row's sum of squares: ``rsqrt(sqsum / n + eps)`` in FP32."""
    return torch.rsqrt(sqsum.float() / n + eps)


def rstd_correction(dot: torch.Tensor, rstd: torch.Tensor, n: int) -> torch.Tensor:
    """RMSNorm-backward correction per row: ``-(rstd**3 / n) * dot`` with dot = sum_n(dy * y).

    With y the un-normalised row and dy the gradient w.r.t. y * rstd, dx = rstd * dy + y * correction.
    """
    r = rstd.float()
    return -(r * r * r / n) * dot.float()
