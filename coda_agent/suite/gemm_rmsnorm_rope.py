"""Reference for gemm_rmsnorm_rope: eager PyTorch, computed in the dtype of its inputs (row scale, angles and
sin/cos in FP32)."""

import torch


def reference(x, w, rstd, positions, inv_freq):
    y = x @ w.t()
    qkv = (y.float() * rstd[:, None]).to(y.dtype)
    theta = positions[:, None].float() * inv_freq[None, 0::2].float()
    cos, sin = theta.cos().to(qkv.dtype), theta.sin().to(qkv.dtype)
    x1, x2 = qkv[:, 0::2], qkv[:, 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return {"out": out.flatten(-2)}
