"""Reference for gemm_rmsnorm_swiglu: eager PyTorch, computed in the dtype of its inputs (row scale in FP32)."""

import torch


def reference(x, w, rstd):
    preact = x @ w.t()
    h = (preact.float() * rstd[:, None]).to(preact.dtype)
    gate, up = h[:, 0::2], h[:, 1::2]
    return {"act": torch.nn.functional.silu(gate) * up, "preact": preact}
