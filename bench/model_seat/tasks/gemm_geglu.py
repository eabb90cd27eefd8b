"""Reference for gemm_geglu: eager PyTorch, computed in the dtype of its inputs."""

import torch


def reference(x, w):
    preact = x @ w.t()
    gate, up = preact[:, 0::2], preact[:, 1::2]
    return {"act": torch.nn.functional.gelu(gate, approximate="tanh") * up, "preact": preact}
