from coda_agent.primitives import ColVecLoad, Config, epilogue, gemm, schedule


@epilogue(operands={"rstd": ColVecLoad()})
def row_scale(acc, rstd):
    return {"D": acc * rstd}


# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H200; forward() as written -> tuned (GPU time):
# coda-agent tune:   llama3-8b-qkv: 956.0 -> 504.0 us
# coda-agent tune:   llama3-1b-qkv: 231.2 -> 131.8 us
# coda-agent tune:   coda-h2048-qkv: 935.5 -> 496.0 us
# coda-agent tune:   coda-h4096-qkv: 3851.3 -> 1969.5 us
# coda-agent tune:   ragged: 811.2 -> 416.2 us
@schedule({
    ('row_scale', 8000, 5000, 4000): Config(tile_m=192, tile_n=128, cluster_m=1, cluster_n=2),
    ('row_scale', 8192, 3072, 2048): Config(cluster_m=1, cluster_n=2),
    ('row_scale', 8192, 6144, 4096): Config(),
    ('row_scale', 16384, 6144, 2048): Config(),
    ('row_scale', 16384, 12288, 4096): Config(),
})
def forward(x, w, rstd):
    config = Config(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1)
    return {"out": gemm(row_scale, x, w.t(), rstd=rstd, config=config)["D"]}
