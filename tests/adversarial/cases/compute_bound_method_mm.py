"""Forbidden compute: a bound method taken as a value (``f = x.mm; f(w.t())``).

Family: forbidden compute. The deny list refuses ``.mm(`` as a *call* of an attribute; reading
``x.float().mm`` into a variable and calling the variable is a plain name call.
"""

import torch


def forward(x, w, residual, gamma, eps):
    product = x.float().mm
    h32 = product(w.float().t()) + residual.float()
    h = h32.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": torch.rsqrt(h32.pow(2).mean(-1) + eps)}
