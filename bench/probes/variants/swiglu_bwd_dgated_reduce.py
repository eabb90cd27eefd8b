"""gemm_swiglu_bwd with QuACK's gemm_dact reduce (dgated_mod): the scaled fold of (act, dout), one fma per pair,
in place of the task's two-product sum dgate*gate + dup*up. Not the task's statistic: a SASS comparison only."""

from coda_agent.primitives import ColVecReduce, dswiglu, epilogue, gemm, pack, unpack


@epilogue(outputs=("act",), reduces={"zdz": ColVecReduce(scaled=True)}, mode="packed")
def swiglu_bwd(acc, c):
    gate, up = unpack(c)
    dgate, dup, act = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "act": act, "zdz": (act, acc)}


def forward(dy, w_down, preact):
    out = gemm(swiglu_bwd, dy, w_down, C=preact)
    return {"dpreact": out["D"], "act": out["act"], "zdz": out["zdz"]}
