from coda_agent.primitives import Config, epilogue, gemm, schedule


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H200; forward() as written -> tuned:
# coda-agent tune:   llama3-8b-o: 811.4 -> 352.1 us
# coda-agent tune:   llama3-1b-down: 846.5 -> 346.0 us
# coda-agent tune:   decode-down: 160.1 us, kept as written (nothing was 1% faster)
@schedule({
    ('add_residual', 8192, 2048, 8192): Config(tile_n=256, pingpong=False),
    ('add_residual', 8192, 4096, 4096): Config(tile_n=208),
})
def forward(x, w, residual):
    config = Config(tile_m=64, tile_n=64, cluster_m=1, cluster_n=1)
    return {"out": gemm(add_residual, x, w.t(), C=residual, config=config)["D"]}
