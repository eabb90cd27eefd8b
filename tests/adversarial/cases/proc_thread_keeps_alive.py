"""A non-daemon thread that never ends: the worker finishes its stages but the process never exits.

Family: busy loops / processes that outlive the verifier. The candidate answers honestly; Python joins
non-daemon threads at exit, so the worker hangs after writing its verdict. It must end as a timeout (or be
refused), and nothing may survive.
"""

import torch

from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def _honest(x, w, residual, gamma, eps):
    out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
    return {"h": out["h"], "normed": out["D"], "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps)}


def _spin():
    n = 0
    while True:
        n += 1


_THREAD = torch.serialization.threading.Thread(target=_spin)
_STARTED = _THREAD.start()


def forward(x, w, residual, gamma, eps):
    return _honest(x, w, residual, gamma, eps)
