"""Forbidden compute: a batched GEMM of batch 1 through the ``Tensor.baddbmm`` method.

Family: forbidden compute. ``baddbmm`` is refused as ``torch.baddbmm``; as a method of the residual it is
not on the deny list.
"""

import torch


def forward(x, w, residual, gamma, eps):
    h32 = residual.float()[None].baddbmm(x.float()[None], w.float().t()[None])[0]
    h = h32.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": torch.rsqrt(h32.pow(2).mean(-1) + eps)}
