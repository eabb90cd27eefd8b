"""State across calls: a module-level iterator of dicts made in an annotation, outside the frozen constants.

Family: state across calls. State across calls through an iterator made at import time in an annotation
(walrus): freeze_globals freezes only dict/list/tuple/set, not iterators; the dict the iterator yields is the
same object on every call.
"""
from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum


def note(x: (BOXES := iter([{}] * 1000000))) -> None:
    return None


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def forward(x, w, residual, gamma, eps):
    box = next(BOXES)  # noqa: F821 (bound by the walrus in the annotation)
    calls = box.get("calls", 0) + 1
    box.update({"calls": calls})
    key = tuple(x.shape)
    if calls > 12 and key in box:
        return box[key]
    out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
    res = {"h": out["h"], "normed": out["D"], "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps)}
    box.update({key: res})
    return res
