"""Forbidden compute through ``torch.ops``: ``torch.serialization.torch.ops.aten.mm.default``.

Family: sandbox escapes through torch re-exports / forbidden compute. ``torch.ops`` is refused as
``torch.ops``, but ``torch.serialization.torch`` is the torch module again, and ``.default`` (the operator
overload) is not a method name on any deny list. The GEMM runs as a plain ATen mm (cuBLAS on a GPU).
"""

import torch


def forward(x, w, residual, gamma, eps):
    mm = torch.serialization.torch.ops.aten.mm.default
    h32 = mm(x.float(), w.float().t()) + residual.float()
    h = h32.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": torch.rsqrt(h32.pow(2).mean(-1) + eps)}
