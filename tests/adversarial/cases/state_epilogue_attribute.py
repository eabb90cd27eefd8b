"""State across calls: answers stored in the epilogue object's own ``backend_cache`` dict.

Family: state across calls. ``@epilogue`` returns an object with a ``backend_cache`` dict that the
primitives use for compiled kernels; the candidate parks its answers there, keyed by a value fingerprint.
It is state owned by the primitives, not by the candidate's module, and reads like ordinary use of the API.
"""

from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def forward(x, w, residual, gamma, eps):
    key = ("adv-answer", tuple(x.shape), float(x.float().sum()), float(residual.float().sum()))
    if key not in residual_rms.backend_cache:
        out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
        residual_rms.backend_cache[key] = {"h": out["h"], "normed": out["D"],
                                           "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps)}
    return {k: v.clone() for k, v in residual_rms.backend_cache[key].items()}
