"""gemm_swiglu_bwd without the recomputed activation's store (2 of its epilogue's 10 bytes an element), at the K-2048
rows' pinned config: what that store costs beside the rest (issue 44)."""

from coda_agent.primitives import ColVecReduce, Config, dswiglu, epilogue, gemm, pack, sigmoid, unpack


@epilogue(reduces={"zdz": ColVecReduce(scaled=True)}, mode="packed")
def swiglu_bwd(acc, c):
    gate, up = unpack(c)
    dgate, dup, act = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "zdz": (acc, act * (2.0 + gate * (1.0 - sigmoid(gate))))}


def forward(dy, w_down, preact):
    out = gemm(swiglu_bwd, dy, w_down, C=preact, config=Config(tile_n=128, cluster_m=1, cluster_n=2))
    return {"dpreact": out["D"], "zdz": out["zdz"]}
