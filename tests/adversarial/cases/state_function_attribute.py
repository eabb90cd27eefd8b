"""State across calls: the cache is an attribute of the ``forward`` function object.

Family: state across calls. ``forward.memo`` is assigned at module level (a plain attribute assignment, no
``global``); forward() reads and fills it. Keyed by a value fingerprint, it answers repeated inputs.
"""

from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def forward(x, w, residual, gamma, eps):
    key = (tuple(x.shape), float(x.float().sum()), float(residual.float().sum()), float(w[0, 0]))
    if key not in forward.memo:
        out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
        forward.memo[key] = {"h": out["h"], "normed": out["D"],
                             "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps)}
    return {k: v.clone() for k, v in forward.memo[key].items()}


forward.memo = {}
