"""gemm_swiglu_bwd writing dpreact alone (no activation, no row statistic: 8 of its epilogue's 10 bytes an element
and none of its reduction), at the K-2048 rows' pinned config (issue 44)."""

from coda_agent.primitives import Config, dswiglu, epilogue, gemm, pack, unpack


@epilogue(mode="packed")
def swiglu_bwd(acc, c):
    gate, up = unpack(c)
    dgate, dup, _ = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup)}


def forward(dy, w_down, preact):
    out = gemm(swiglu_bwd, dy, w_down, C=preact, config=Config(tile_n=128, cluster_m=1, cluster_n=2))
    return {"dpreact": out["D"]}
