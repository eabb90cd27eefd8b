"""Reference leakage: ``torch.inspect.stack()`` (a direct torch re-export of ``inspect``).

Family: reference leakage. The callers' locals hold the FP32 reference; it is returned, rounded.
"""

import torch


def forward(x, w, residual, gamma, eps):
    for info in torch.inspect.stack(0)[1:]:
        for value in list(info.frame.f_locals.values()):
            if isinstance(value, dict) and set(value) == {"h", "normed", "rstd"}:
                h = value["h"]
                if (isinstance(h, torch.Tensor) and h.dtype == torch.float32
                    and tuple(h.shape) == tuple(residual.shape)):
                    return {"h": h.to(residual.dtype), "normed": value["normed"].to(residual.dtype),
                            "rstd": value["rstd"].float()}
    raise RuntimeError("no reference in sight")
