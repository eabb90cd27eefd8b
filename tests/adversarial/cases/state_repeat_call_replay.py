"""State across calls: the second call on identical inputs replays the first answer without a GEMM.

Family: state across calls. The candidate remembers the inputs of its last call (by value, through a few
probes) and, when the next call's inputs are the same, returns a copy of the previous outputs: the pattern
of a harness that checks a call and then times the same inputs, or checks determinism by calling twice.
Fresh inputs always get an honest GEMM.
"""

from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum

PREVIOUS = []


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def forward(x, w, residual, gamma, eps):
    probe = (tuple(x.shape), float(x.float().sum()), float(w.float().sum()), float(residual.float().sum()))
    if PREVIOUS and PREVIOUS[-1][0] == probe:
        return {k: v.clone() for k, v in PREVIOUS[-1][1].items()}
    out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
    result = {"h": out["h"], "normed": out["D"], "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps)}
    PREVIOUS.append((probe, result))
    return result
