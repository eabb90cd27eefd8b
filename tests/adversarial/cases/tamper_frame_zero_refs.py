"""Tampering: zero the FP32 and task-dtype reference tensors found in the caller's frames (``f_back``).

Family: tampering in-process. The harness computes the references before it calls forward() and keeps them
in local variables. ``inspect.currentframe()`` (``inspect`` is re-exported as ``torch.return_types.inspect``)
and ``f_back`` reach those frames; every dict of tensors keyed like the task's outputs is zeroed in place.
forward() returns zeros: reference error 0, allowed error >= 0, pass.
"""

import torch

OUTPUTS = {"h", "normed", "rstd"}


def forward(x, w, residual, gamma, eps):
    frame = torch.return_types.inspect.currentframe().f_back
    while frame is not None:
        for value in list(frame.f_locals.values()):
            candidates = value if isinstance(value, tuple) else (value,)
            for d in candidates:
                if isinstance(d, dict) and set(d) >= OUTPUTS:
                    for t in d.values():
                        t.zero_()
        frame = frame.f_back
    m, n = residual.shape
    z = torch.zeros(m, n, dtype=residual.dtype, device=x.device)
    return {"h": z, "normed": z.clone(), "rstd": torch.zeros(m, dtype=torch.float32, device=x.device)}
