import torch

from coda_agent.primitives import ColVecReduce, Config, epilogue, gemm, schedule


@epilogue(reduces={"mean": ColVecReduce(), "meansq": ColVecReduce(scaled=True)})
def residual_stats(acc, c, inv_n):
    h = acc + c
    return {"D": h, "mean": h * inv_n, "meansq": (h, h * inv_n)}


# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H100 80GB HBM3; forward() as written -> tuned (GPU time):
# coda-agent tune:   llama3-8b-down: 3495.9 -> 1197.0 us
@schedule({
    ('residual_stats', 8192, 4096, 14336): Config(tile_n=256, pingpong=False),
})
def forward(x, w, residual, eps):
    config = Config(tile_m=64, tile_n=64, cluster_m=1, cluster_n=1)
    out = gemm(residual_stats, x, w.t(), C=residual, inv_n=1.0 / w.shape[0], config=config)
    mean = out["mean"]
    return {"h": out["D"], "mean": mean, "rstd": torch.rsqrt(out["meansq"] - mean * mean + eps)}
