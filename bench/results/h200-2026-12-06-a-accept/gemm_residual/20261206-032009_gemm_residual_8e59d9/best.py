from coda_agent.primitives import Config, epilogue, gemm, schedule


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H200; forward() as written -> tuned (GPU time):
# coda-agent tune:   llama3-8b-down: 2117.2 -> 1181.4 us
# coda-agent tune:   llama3-8b-o: 588.7 -> 351.4 us
# coda-agent tune:   llama3-1b-down: 605.5 -> 342.5 us
# coda-agent tune:   coda-h4096-down: 3301.3 -> 1830.0 us
# coda-agent tune:   ragged: 1106.6 -> 447.2 us
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
