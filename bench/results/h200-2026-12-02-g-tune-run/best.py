from coda_agent.primitives import Config, epilogue, gemm, schedule


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H200; forward() as written -> tuned (GPU time):
# coda-agent tune:   llama3-8b-o: 825.2 -> 355.7 us
# coda-agent tune:   llama3-1b-down: 863.4 -> 351.4 us
# coda-agent tune:   decode-down: 106.3 -> 49.5 us
@schedule({
    ('add_residual', 1024, 2048, 8192): Config(tile_n=128, cluster_m=1, cluster_n=2),
    ('add_residual', 8192, 2048, 8192): Config(tile_n=256, pingpong=False),
    ('add_residual', 8192, 4096, 4096): Config(tile_n=208),
})
def forward(x, w, residual):
    config = Config(tile_m=64, tile_n=64, cluster_m=1, cluster_n=1)
    return {"out": gemm(add_residual, x, w.t(), C=residual, config=config)["D"]}
