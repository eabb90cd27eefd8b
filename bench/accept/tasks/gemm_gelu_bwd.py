"""Reference for gemm_gelu_bwd: eager PyTorch in the dtype of its inputs."""

import math

import torch


def reference(dy, w_down, preact):
    dact = dy @ w_down
    x = preact
    k = math.sqrt(2.0 / math.pi)
    t = torch.tanh(k * (x + 0.044715 * x * x * x))
    act = 0.5 * x * (1 + t)
    dgelu = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)
    return {"dpreact": dact * dgelu, "act": act}
