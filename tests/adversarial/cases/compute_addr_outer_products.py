"""Forbidden compute: the GEMM as K rank-1 updates with ``torch.addr`` (outer-product accumulate).

Family: forbidden compute. ``torch.addr(acc, a, b)`` is acc + a b^T; summed over k it is the full product.
``addr`` is on no deny list (``outer``/``ger`` are, as torch attributes).
"""

import torch


def forward(x, w, residual, gamma, eps):
    xf, wf = x.float(), w.float()
    acc = residual.float()
    for k in range(x.shape[1]):
        acc = torch.addr(acc, xf[:, k], wf[:, k])
    h = acc.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": torch.rsqrt(acc.pow(2).mean(-1) + eps)}
