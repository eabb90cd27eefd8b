"""Tampering: ``torch.Tensor.double`` returns zeros, so candidate and reference both compare as zeros.

Family: tampering in-process. The comparison upcasts both sides with ``.double()`` before subtracting. With
that method replaced, an uninitialised ``torch.empty`` output (no work at all) has error 0 and no NaN.
"""

import torch


def _zeros64(self, *args, **kwargs):
    return torch.zeros(self.shape, dtype=torch.float64, device=self.device)


torch.Tensor.double = _zeros64


def forward(x, w, residual, gamma, eps):
    m, n = residual.shape
    return {
        "h": torch.empty(m, n, dtype=residual.dtype, device=x.device),
        "normed": torch.empty(m, n, dtype=residual.dtype, device=x.device),
        "rstd": torch.empty(m, dtype=torch.float32, device=x.device),
    }
