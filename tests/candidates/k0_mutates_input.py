"""Bad candidate: correct outputs, but it overwrites its residual input with h (an in-place "optimisation")."""

from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def forward(x, w, residual, gamma, eps):
    out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
    residual.copy_(out["h"])
    return {"h": residual, "normed": out["D"], "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps)}
