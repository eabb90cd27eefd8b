"""Reference for gemm_rmsnorm_swiglu: eager PyTorch, computed in the dtype of its inputs (row scale in FP32)."""

import torch


def reference(x, w, rstd):
    y = x @ w.t()
    z = (y.float() * rstd[:, None]).to(y.dtype)
    gate, up = z[:, 0::2], z[:, 1::2]
    return {"act": torch.nn.functional.silu(gate) * up, "preact": z}
