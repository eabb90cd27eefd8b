"""Gate/up GEMM + deferred rstd + SwiGLU (CODA k2) in acc_pair mode: the row scale multiplies both lanes of
each (gate, up) pair of the FP32 accumulator; D stores the scaled pair at full width (the pre-activation the
backward takes) and the half-width extra output is the activation."""

from coda_agent.primitives import ColVecLoad, epilogue, gemm, pack, swiglu, unpack


@epilogue(outputs=("act",), operands={"rstd": ColVecLoad()}, mode="acc_pair")
def norm_gated(acc, rstd):
    gate, up = unpack(acc * rstd)
    return {"D": pack(gate, up), "act": swiglu(gate, up)}


def forward(x, w, rstd):
    out = gemm(norm_gated, x, w.t(), rstd=rstd)
    return {"act": out["act"], "preact": out["D"]}
