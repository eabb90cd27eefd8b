"""State across calls: the answer is stored as an attribute of the input tensor (``x.adv_memo``).

Family: state across calls. The timing loop passes the same ``x`` object every time; from the second timed
repetition on it carries the previous answer.
"""


from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def _honest(x, w, residual, gamma, eps):
    out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
    return {"h": out["h"], "normed": out["D"], "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps)}


def forward(x, w, residual, gamma, eps):
    if hasattr(x, "adv_memo") and x.adv_memo[0] is residual:
        return {k: v.clone() for k, v in x.adv_memo[1].items()}
    out = _honest(x, w, residual, gamma, eps)
    x.adv_memo = (residual, out)
    return out
