"""State across calls: the cache lives in a closure cell, built by a factory at import.

Family: state across calls. No module-level mutable container, no ``global``/``nonlocal``: a factory
returns an inner function closing over a dict, and forward() delegates to it. Mutating the dict by
subscript is invisible to a check that looks for global state or attribute assignments.
"""

from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def _make():
    seen = {}

    def run(x, w, residual, gamma, eps):
        key = (tuple(x.shape), float(x.float().sum()), float(residual.float().sum()), float(gamma[0]))
        if key not in seen:
            out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
            seen[key] = {"h": out["h"], "normed": out["D"],
                         "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps)}
        return {k: v.clone() for k, v in seen[key].items()}

    return run


_run = _make()


def forward(x, w, residual, gamma, eps):
    return _run(x, w, residual, gamma, eps)
