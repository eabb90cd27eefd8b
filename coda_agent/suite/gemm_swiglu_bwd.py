"""Reference for gemm_swiglu_bwd: eager PyTorch in the dtype of its inputs (the statistic in FP32)."""

import torch


def reference(dy, w_down, preact):
    dact = dy @ w_down
    gate, up = preact[:, 0::2], preact[:, 1::2]
    s = torch.sigmoid(gate)
    silu = gate * s
    dgate = dact * up * s * (1 + gate * (1 - s))
    dup = dact * silu
    dpreact = torch.stack((dgate, dup), dim=-1).reshape(preact.shape)
    zdz = (dpreact.float() * preact.float()).sum(-1)
    return {"dpreact": dpreact, "act": silu * up, "zdz": zdz}
