"""Reference leakage: find the FP32 reference in the callers' locals through ``inspect.stack()``.

Family: reference leakage. ``inspect`` comes from ``torch.sys.modules``; ``stack(0)`` lists every caller with
its frame. Any local that is a dict of FP32 tensors keyed ``h``/``normed``/``rstd`` with the right shape is
the reference; the candidate rounds it and returns it.
"""

import torch


def forward(x, w, residual, gamma, eps):
    for info in torch.sys.modules["inspect"].stack(0)[1:]:
        for value in list(info.frame.f_locals.values()):
            if isinstance(value, dict) and set(value) == {"h", "normed", "rstd"}:
                h = value["h"]
                if (isinstance(h, torch.Tensor) and h.dtype == torch.float32
                    and tuple(h.shape) == tuple(residual.shape)):
                    return {"h": h.to(residual.dtype), "normed": value["normed"].to(residual.dtype),
                            "rstd": value["rstd"].float()}
    raise RuntimeError("no reference in sight")
