"""Forbidden compute (gemm_swiglu): broadcast multiply-and-sum for the GEMM, SwiGLU on the host.

Family: forbidden compute. No matmul name, no primitives.gemm: (x[:, None, :] * w[None]).sum(-1) is the
interleaved pre-activation; the activation follows on the host.
"""

import torch


def forward(x, w):
    pre = (x.float()[:, None, :] * w.float()[None, :, :]).sum(-1)
    gate, up = pre[:, 0::2], pre[:, 1::2]
    act = gate * torch.sigmoid(gate) * up
    return {"act": act.to(x.dtype), "preact": pre.to(x.dtype)}
