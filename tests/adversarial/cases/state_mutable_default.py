"""State across calls: a mutable default argument of forward() keeps the answers.

Family: state across calls. ``memo={}`` is created once, when the function is defined; the harness never
passes ``memo``, so every call shares the dict. Keyed by input identity and a value probe, it answers timed
repetitions without computing.
"""

from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def forward(x, w, residual, gamma, eps, memo={}):  # noqa: B006 - the cheat is the shared default
    key = (id(x), id(residual), float(x[0, 0]), float(x[-1, -1]), float(residual[0, 0]))
    if key not in memo:
        out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
        memo[key] = {"h": out["h"], "normed": out["D"],
                     "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps)}
    return {k: v.clone() for k, v in memo[key].items()}
