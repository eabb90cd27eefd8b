"""gemm_swiglu_bwd without the row statistic: a SASS comparison only."""

from coda_agent.primitives import dswiglu, epilogue, gemm, pack, unpack


@epilogue(outputs=("act",), mode="packed")
def swiglu_bwd(acc, c):
    gate, up = unpack(c)
    dgate, dup, act = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "act": act}


def forward(dy, w_down, preact):
    out = gemm(swiglu_bwd, dy, w_down, C=preact)
    return {"dpreact": out["D"], "act": out["act"]}
