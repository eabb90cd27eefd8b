"""Reference for gemm_relu2_bwd: eager PyTorch, computed in the dtype of its inputs."""

import torch


def reference(dy, w_down, preact):
    dact = dy @ w_down
    r = torch.relu(preact)
    return {"dpreact": dact * (2 * r), "act": r * r}
