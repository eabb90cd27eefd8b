"""Bad candidate: launches the fused GEMM on a side stream (the static check refuses torch.cuda; the GPU
trace must catch it when the static check is bypassed)."""

import torch

from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def forward(x, w, residual, gamma, eps):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
        rstd = rstd_from_sqsum(out["sqsum"], w.shape[0], eps)
    return {"h": out["h"], "normed": out["D"], "rstd": rstd}
