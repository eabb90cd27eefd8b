"""SwiGLU backward in the epilogue of the down-proj dgrad GEMM (CODA k7).

Packed mode: the accumulator is dact (M, F) and C is the saved interleaved pre-activation (M, 2F); the
epilogue writes the interleaved dpreact, the recomputed activation and the per-row statistic
sum(dpreact * preact) (a two-product sum, so an unscaled reduce). Launches: the GEMM and the finalisation.
"""

from coda_agent.primitives import ColVecReduce, dswiglu, epilogue, gemm, pack, unpack


@epilogue(outputs=("act",), reduces={"zdz": ColVecReduce()}, mode="packed")
def swiglu_bwd(acc, c):
    gate, up = unpack(c)
    dgate, dup, act = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "act": act, "zdz": dgate * gate + dup * up}


def forward(dy, w_down, preact):
    out = gemm(swiglu_bwd, dy, w_down, C=preact)
    return {"dpreact": out["D"], "act": out["act"], "zdz": out["zdz"]}
