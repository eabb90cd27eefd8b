"""GEMM -> RMSNorm -> GEMM block with the norm fused away (deferred rstd): o-projection, then gate/up + SwiGLU.

GEMM1 (o-projection): the epilogue adds the residual, writes h and h * gamma and folds h^2 / H into row sums
(the mean of squares); the host finalises rstd = rsqrt(mean + eps) (two tiny kernels). GEMM2 (gate/up,
acc_pair mode over the interleaved columns) scales its FP32 accumulator by rstd, stores the scaled pair as
the pre-activation the SwiGLU backward needs, and writes the activation.
Launches: GEMM1, the mean finalisation, 2 host ops, GEMM2.
"""

import torch

from coda_agent.primitives import ColVecLoad, ColVecReduce, Config, RowVecLoad, epilogue, gemm, pack, schedule, swiglu, unpack


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"meansq": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma, inv_n):
    h = acc + c
    return {"D": h * gamma, "h": h, "meansq": (h, h * inv_n)}


@epilogue(outputs=("act",), operands={"rstd": ColVecLoad()}, mode="acc_pair")
def rstd_swiglu(acc, rstd):
    gate, up = unpack(acc * rstd)
    return {"D": pack(gate, up), "act": swiglu(gate, up)}


# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H200; forward() as written -> tuned (GPU time):
# coda-agent tune:   ragged: 2005.9 -> 1983.2 us
@schedule({
    ('rstd_swiglu', 8000, 20000, 4000): Config(tile_m=192, tile_n=128, cluster_m=1, cluster_n=2),
})
def forward(a, w_o, residual, gamma, w_gate_up, eps):
    first = gemm(residual_rms, a, w_o.t(), C=residual, gamma=gamma, inv_n=1.0 / w_o.shape[0])
    rstd = torch.rsqrt(first["meansq"] + eps)
    second = gemm(rstd_swiglu, first["D"], w_gate_up.t(), rstd=rstd)
    return {"h": first["h"], "act": second["act"], "rstd": rstd, "preact": second["D"]}
