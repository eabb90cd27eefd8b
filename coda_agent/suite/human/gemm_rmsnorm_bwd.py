"""RMSNorm backward + residual gradient + dgamma in the epilogue of the dgrad GEMM (CODA k6).

acc = g = dz @ w; C = dres; h is a tile operand; gamma a row vector; rstd and the incoming correction
statistic zdz column vectors. D = dres + rstd * (gamma * g - h * rstd * zdz / N); dgamma folds g * h * rstd
down the columns; the extra output normed = h * rstd * gamma is the consumer's input, recomputed for its
weight gradient. Launches: the GEMM and the dgamma finalisation.
"""

from coda_agent.primitives import ColVecLoad, Config, RowVecLoad, RowVecReduce, epilogue, gemm, schedule


@epilogue(
    outputs=("normed",),
    operands={"gamma": RowVecLoad(), "rstd": ColVecLoad(), "zdz": ColVecLoad()},
    reduces={"dgamma": RowVecReduce(scaled=True)},
)
def rms_bwd(acc, c, h, gamma, rstd, zdz, neg_inv_n):
    xhat = h * rstd
    return {"D": (acc * gamma + xhat * (zdz * neg_inv_n)) * rstd + c, "normed": xhat * gamma, "dgamma": (acc, xhat)}


# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H100 80GB HBM3; forward() as written -> tuned (GPU time;
# coda-agent tune: bench/results/h100-2026-12-06-c-tune-human-2.json):
# coda-agent tune:   llama3-8b-gateup: 2533.6 us, kept as written (nothing was 1% faster)
# coda-agent tune:   llama3-1b-gateup: 758.9 -> 738.1 us
# coda-agent tune:   coda-h2048: 1015.2 -> 995.7 us
# coda-agent tune:   coda-h4096: 3946.6 us, kept as written (nothing was 1% faster)
# coda-agent tune:   ragged: 1786.3 us, kept as written (nothing was 1% faster)
# coda-agent tune: and from bench/probes/schedule_probe.py on an H100 (h100-2026-12-06-b-probe-swizzle.log):
# coda-agent tune:   the Llama-3 1B stack's q/k/v dgrad (bench-e2e, M = 4 x 8192 tokens): 647.2 -> 627.9 us with
# coda-agent tune:   its 11 column tiles in one swizzle group (each row block of dz read from HBM once, not twice)
@schedule({
    ('rms_bwd', 8192, 2048, 16384): Config(tile_n=128, max_swizzle_size=16),
    ('rms_bwd', 16384, 2048, 11264): Config(max_swizzle_size=16),
    ('rms_bwd', 32768, 2048, 3072): Config(max_swizzle_size=16),
})
def forward(dz, w, h, gamma, rstd, zdz, dres):
    out = gemm(rms_bwd, dz, w, C=dres, h=h, gamma=gamma, rstd=rstd, zdz=zdz, neg_inv_n=-1.0 / h.shape[1])
    return {"dh": out["D"], "dgamma": out["dgamma"], "normed": out["normed"]}
