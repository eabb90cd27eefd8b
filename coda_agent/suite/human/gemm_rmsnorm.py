"""GEMM with the deferred RMSNorm row scale (CODA k1): the FP32 accumulator is multiplied by the row's rstd
(a column-vector operand) before the single rounding to bf16."""

from coda_agent.primitives import ColVecLoad, Config, epilogue, gemm, schedule


@epilogue(operands={"rstd": ColVecLoad()})
def row_scale(acc, rstd):
    return {"D": acc * rstd}


# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H200; forward() as written -> tuned (GPU time):
# coda-agent tune:   ragged: 431.2 -> 413.5 us
@schedule({
    ('row_scale', 8000, 5000, 4000): Config(tile_m=192, tile_n=128, cluster_m=1, cluster_n=2),
})
def forward(x, w, rstd):
    return {"out": gemm(row_scale, x, w.t(), rstd=rstd)["D"]}
