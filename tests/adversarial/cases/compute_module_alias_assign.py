"""Forbidden compute: the torch module bound to another name at runtime (``T = torch.serialization.torch``).

Family: forbidden compute (aliases). ``torch.serialization`` (like ``torch.functional``) re-exports the torch
module; binding it to a local name and calling ``T.tensordot`` hides both the module and the function
from a check that only follows the name ``torch``.
"""

import torch


def forward(x, w, residual, gamma, eps):
    T = torch.serialization.torch
    h32 = T.tensordot(x.float(), w.float(), dims=([1], [1])) + residual.float()
    h = h32.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": torch.rsqrt(h32.pow(2).mean(-1) + eps)}
