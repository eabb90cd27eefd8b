"""Bad candidate: like k0_cached, but returns fresh copies of the cached answer (no buffer reuse to spot)."""

from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum

CACHE = {}


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def forward(x, w, residual, gamma, eps):
    key = tuple(x.shape)
    if key not in CACHE:
        out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
        CACHE[key] = {"h": out["h"], "normed": out["D"], "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps)}
    return {k: v.clone() for k, v in CACHE[key].items()}
