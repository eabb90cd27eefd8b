"""Bad candidate: the GEMM covers only the first half of the rows; the rest of h is never written."""

import torch

from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def forward(x, w, residual, gamma, eps):
    half = x.shape[0] // 2
    part = gemm(residual_rms, x[:half], w.t(), C=residual[:half], gamma=gamma)
    h = torch.empty_like(residual)
    h[:half] = part["h"]
    normed = torch.empty_like(residual)
    normed[:half] = part["D"]
    rstd = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    rstd[:half] = rstd_from_sqsum(part["sqsum"], w.shape[0], eps)
    return {"h": h, "normed": normed, "rstd": rstd}
