"""Forbidden compute (gemm_rmsnorm_bwd): the dgrad GEMM as ``conv_transpose1d``, the RMSNorm backward on the
host.

Family: forbidden compute. dz (M, K) @ w (K, N) as a transposed 1-wide convolution; the epilogue algebra
(gamma, rstd, the zdz correction, dgamma) in plain torch.
"""

import torch


def forward(dz, w, h, gamma, rstd, zdz, dres):
    g = torch.conv_transpose1d(dz.float().unsqueeze(-1), w.float().unsqueeze(-1)).squeeze(-1)
    n = h.shape[1]
    xhat = h.float() * rstd[:, None]
    dh = (g * gamma.float() - xhat * (zdz[:, None] / n)) * rstd[:, None] + dres.float()
    dgamma = (g * xhat).sum(0)
    return {"dh": dh.to(dz.dtype), "dgamma": dgamma, "normed": (xhat * gamma.float()).to(dz.dtype)}
