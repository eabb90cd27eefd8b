"""Gate/up GEMM + deferred rstd + SwiGLU (CODA k2) in acc_pair mode: the row scale multiplies both lanes of
each (gate, up) pair before the activation; D is left unset, so the UNSCALED accumulator is stored at full
width as the pre-activation for the backward."""

from coda_agent.primitives import ColVecLoad, epilogue, gemm, swiglu, unpack


@epilogue(outputs=("act",), operands={"rstd": ColVecLoad()}, mode="acc_pair")
def norm_gated(acc, rstd):
    gate, up = unpack(acc * rstd)
    return {"act": swiglu(gate, up)}


def forward(x, w, rstd):
    out = gemm(norm_gated, x, w.t(), rstd=rstd)
    return {"act": out["act"], "preact": out["D"]}
