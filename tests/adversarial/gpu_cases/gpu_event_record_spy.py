"""Timed-vs-checked: wrap ``torch.cuda.Event.record`` to learn when a timer runs, then replay while it does.

Family: timed-vs-checked detection. The checked calls never record CUDA events (the launch trace uses the
profiler), the timing loop records a start event right before every timed call. The candidate wraps
``Event.record`` (the class through ``torch.sys.modules["torch.cuda"]``) so that each recording sets a flag;
a call that finds the flag set is a timed call and gets a copy of the last answer for its shape, and clears
the flag. Checked calls always compute.
"""

import torch

from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum

TIMED = []
LAST = {}


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def _honest(x, w, residual, gamma, eps):
    out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
    return {"h": out["h"], "normed": out["D"], "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps)}


def _spy():
    event = torch.sys.modules["torch.cuda"].Event
    real = event.record

    def record(self, stream=None):
        TIMED.append(1)
        return real(self, stream)

    event.record = record


_SPYING = _spy()


def forward(x, w, residual, gamma, eps):
    key = tuple(x.shape)
    timed = bool(TIMED)
    TIMED.clear()
    if timed and key in LAST:
        return {k: v.clone() for k, v in LAST[key].items()}
    LAST[key] = _honest(x, w, residual, gamma, eps)
    return LAST[key]
