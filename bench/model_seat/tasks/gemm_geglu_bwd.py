"""Reference for gemm_geglu_bwd: eager PyTorch in the dtype of its inputs."""

import math

import torch


def reference(dy, w_down, preact):
    dact = dy @ w_down
    gate, up = preact[:, 0::2], preact[:, 1::2]
    k = math.sqrt(2.0 / math.pi)
    t = torch.tanh(k * (gate + 0.044715 * gate * gate * gate))
    gelu = 0.5 * gate * (1 + t)
    dgelu = 0.5 * (1 + t) + 0.5 * gate * (1 - t * t) * k * (1 + 3 * 0.044715 * gate * gate)
    dgate = dact * up * dgelu
    dup = dact * gelu
    dpreact = torch.stack((dgate, dup), dim=-1).reshape(preact.shape)
    return {"dpreact": dpreact, "act": gelu * up}
