"""GEMM + residual + RMSNorm statistic in one kernel (CODA k0, deferred rstd).

The epilogue adds the residual tile to the FP32 accumulator, writes the residual stream h and h * gamma,
and folds h^2 into per-row sums; the host turns the sums into rstd (one tiny kernel).
"""

from coda_agent.primitives import ColVecReduce, Config, RowVecLoad, epilogue, gemm, rstd_from_sqsum, schedule


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H200; forward() as written -> tuned (GPU time):
# coda-agent tune:   (bench/results/h200-2026-12-02-g-tune-human.json; coda-h2048's 128x208 from QuACK's autotuner,
# coda-agent tune:   bench/tuning/h200-2026-11-29.json, kept by this search)
# coda-agent tune:   llama3-8b-down: 1227.0 -> 1200.4 us
# coda-agent tune:   llama3-1b-down: 370.5 -> 358.4 us
# coda-agent tune:   ragged: 1218.0 -> 1190.2 us
# coda-agent tune: then on an NVIDIA H100 80GB HBM3 (bench/results/h100-2026-12-06-c-tune-human-2.json):
# coda-agent tune:   coda-h2048: 518.3 -> 503.0 us, its 10 column tiles in one swizzle group, on QuACK's kernel
@schedule({
    ('residual_rms', 8000, 4000, 14336): Config(tile_n=256, pingpong=False),
    ('residual_rms', 8192, 2048, 8192): Config(tile_n=208),
    ('residual_rms', 8192, 4096, 14336): Config(tile_n=256, pingpong=False),
    ('residual_rms', 16384, 2048, 5632): Config(tile_n=208, max_swizzle_size=16, load_ahead=False),
})
def forward(x, w, residual, gamma, eps):
    out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
    return {"h": out["h"], "normed": out["D"], "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps)}
