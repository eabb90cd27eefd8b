"""GEMM -> RMSNorm -> GEMM block with the norm fused away (deferred rstd).

GEMM1 (down projection): the epilogue adds the residual, writes h and h * gamma and folds h^2 / H into
row sums (the mean of squares); the host finalises rstd = rsqrt(mean + eps) (two tiny kernels). GEMM2
(gate/up, acc_pair mode over the interleaved columns) scales its FP32 accumulator by rstd and applies
SwiGLU, writing only the activation (store_d=False: the pre-activation is not a task output).
Launches: GEMM1, the mean finalisation, 2 host ops, GEMM2.
"""

import torch

from coda_agent.primitives import ColVecLoad, ColVecReduce, RowVecLoad, epilogue, gemm, swiglu, unpack


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"meansq": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma, inv_n):
    h = acc + c
    return {"D": h * gamma, "h": h, "meansq": (h, h * inv_n)}


@epilogue(outputs=("act",), operands={"rstd": ColVecLoad()}, mode="acc_pair")
def rstd_swiglu(acc, rstd):
    gate, up = unpack(acc * rstd)
    return {"act": swiglu(gate, up)}


def forward(a, w_down, residual, gamma, w_gate_up, eps):
    first = gemm(residual_rms, a, w_down.t(), C=residual, gamma=gamma, inv_n=1.0 / w_down.shape[0])
    rstd = torch.rsqrt(first["meansq"] + eps)
    second = gemm(rstd_swiglu, first["D"], w_gate_up.t(), rstd=rstd, store_d=False)
    return {"h": first["h"], "act": second["act"], "rstd": rstd}
