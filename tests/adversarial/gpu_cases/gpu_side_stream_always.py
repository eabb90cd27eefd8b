"""Every call's GEMM on a side stream, joined back to the caller's stream (results correct, trace not).

Family: CUDA-specific cheats (side streams). Work on another stream escapes a timer that only brackets the
caller's stream and can overlap with whatever the caller does next; the harness requires all work on the
caller's stream. The side stream waits for the caller and the caller waits for it, so outputs are always
right; only the stream rule is broken. Must be caught by the trace of the checked calls and of the timed ones.
"""

import torch

from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum

SIDE = []


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def _honest(x, w, residual, gamma, eps):
    out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
    return {"h": out["h"], "normed": out["D"], "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps)}


def forward(x, w, residual, gamma, eps):
    cuda = torch.sys.modules["torch.cuda"]
    if not SIDE:
        SIDE.append(cuda.Stream())
    caller = cuda.current_stream()
    SIDE[0].wait_stream(caller)
    cuda.set_stream(SIDE[0])
    out = _honest(x, w, residual, gamma, eps)
    cuda.set_stream(caller)
    caller.wait_stream(SIDE[0])
    return out
