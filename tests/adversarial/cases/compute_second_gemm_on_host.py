"""Forbidden compute (gemm_rmsnorm_gemm): the first GEMM through primitives, the second with ``Tensor.inner``.

Family: forbidden compute. A GPU trace check that asks for "a QuACK kernel" is satisfied by GEMM1; the
gate/up GEMM (the larger one) runs on the host with ``inner`` (cuBLAS on a GPU). Every task GEMM must go
through primitives.gemm.
"""

import torch

from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"meansq": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma, inv_n):
    h = acc + c
    return {"D": h * gamma, "h": h, "meansq": (h, h * inv_n)}


def forward(a, w_o, residual, gamma, w_gate_up, eps):
    first = gemm(residual_rms, a, w_o.t(), C=residual, gamma=gamma, inv_n=1.0 / w_o.shape[0])
    rstd = torch.rsqrt(first["meansq"] + eps)
    pre = first["D"].float().inner(w_gate_up.float()) * rstd[:, None]
    gate, up = pre[:, 0::2], pre[:, 1::2]
    act = gate * torch.sigmoid(gate) * up
    return {"h": first["h"], "act": act.to(a.dtype), "rstd": rstd, "preact": pre.to(a.dtype)}
