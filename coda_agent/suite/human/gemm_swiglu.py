"""Gate/up GEMM + SwiGLU (CODA k8) in acc_pair mode: adjacent accumulator columns (2j, 2j+1) are the
(gate, up) pair of hidden unit j. D is left unset, so the raw accumulator (the pre-activation, needed by the
backward) is stored at full width; the half-width extra output is the activation."""

from coda_agent.primitives import epilogue, gemm, swiglu, unpack


@epilogue(outputs=("act",), mode="acc_pair")
def gated(acc):
    gate, up = unpack(acc)
    return {"act": swiglu(gate, up)}


def forward(x, w):
    out = gemm(gated, x, w.t())
    return {"act": out["act"], "preact": out["D"]}
