from coda_agent.primitives import Config, epilogue, gemm, schedule, tanh


@epilogue(outputs=("act",))
def gelu_bwd(acc, c):
    k = 0.7978845608028654  # sqrt(2 / pi)
    t = tanh(k * (c + 0.044715 * c * c * c))
    dgelu = 0.5 * (1.0 + t) + 0.5 * c * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * c * c)
    return {"D": acc * dgelu, "act": 0.5 * c * (1.0 + t)}


# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H100 80GB HBM3; forward() as written -> tuned (GPU time):
# coda-agent tune:   llama3-8b: 2672.3 -> 1265.4 us
@schedule({
    ('gelu_bwd', 8192, 14336, 4096): Config(),
})
def forward(dy, w_down, preact):
    config = Config(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1)
    out = gemm(gelu_bwd, dy, w_down, C=preact, config=config)
    return {"dpreact": out["D"], "act": out["act"]}
