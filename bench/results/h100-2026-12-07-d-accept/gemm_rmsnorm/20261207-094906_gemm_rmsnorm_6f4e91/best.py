from coda_agent.primitives import ColVecLoad, Config, epilogue, gemm, schedule


@epilogue(operands={"rstd": ColVecLoad()})
def row_scale(acc, rstd):
    return {"D": acc * rstd}


# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H100 80GB HBM3; forward() as written -> tuned (GPU time):
# coda-agent tune:   llama3-8b-qkv: 1122.2 -> 507.8 us
# coda-agent tune:   llama3-1b-qkv: 278.0 -> 131.5 us
# coda-agent tune:   coda-h2048-qkv: 1114.0 -> 497.5 us
# coda-agent tune:   coda-h4096-qkv: 4527.1 -> 1983.6 us
# coda-agent tune:   ragged: 945.8 -> 427.0 us
@schedule({
    ('row_scale', 8000, 5000, 4000): Config(tile_m=192, tile_n=128, cluster_m=1, cluster_n=2),
    ('row_scale', 8192, 3072, 2048): Config(max_swizzle_size=16),
    ('row_scale', 8192, 6144, 4096): Config(tile_m=256, cluster_m=1, cluster_n=2, pingpong=False),
    ('row_scale', 16384, 6144, 2048): Config(),
    ('row_scale', 16384, 12288, 4096): Config(),
})
def forward(x, w, rstd):
    config = Config(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1)
    return {"out": gemm(row_scale, x, w.t(), rstd=rstd, config=config)["D"]}
