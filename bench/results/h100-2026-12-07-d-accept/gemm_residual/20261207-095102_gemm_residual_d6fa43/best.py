from coda_agent.primitives import Config, epilogue, gemm, schedule


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H100 80GB HBM3; forward() as written -> tuned (GPU time):
# coda-agent tune:   llama3-8b-down: 2517.2 -> 1182.4 us
# coda-agent tune:   llama3-8b-o: 713.6 -> 351.6 us
# coda-agent tune:   llama3-1b-down: 693.1 -> 345.4 us
# coda-agent tune:   coda-h4096-down: 4224.6 -> 1828.3 us
# coda-agent tune:   ragged: 1280.1 -> 463.0 us
@schedule({
    ('add_residual', 8000, 4000, 5000): Config(tile_m=192, pingpong=False),
    ('add_residual', 8192, 2048, 8192): Config(tile_n=256, pingpong=False),
    ('add_residual', 8192, 4096, 4096): Config(tile_n=208, load_ahead=False),
    ('add_residual', 8192, 4096, 14336): Config(tile_n=256, pingpong=False),
    ('add_residual', 16384, 4096, 11008): Config(tile_n=256, pingpong=False),
})
def forward(x, w, residual):
    config = Config(tile_m=128, tile_n=64, cluster_m=1, cluster_n=1)
    return {"out": gemm(add_residual, x, w.t(), C=residual, config=config)["D"]}
