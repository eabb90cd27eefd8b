"""SwiGLU backward in the epilogue of the down-proj dgrad GEMM (CODA k7).

Packed mode: the accumulator is dact (M, F) and C is the saved interleaved pre-activation (M, 2F); the
epilogue writes the interleaved dpreact, the recomputed activation and the per-row statistic
sum(dpreact * preact). Per pair that is dgate*gate + dup*up = dact * act * (2 + gate*(1 - sigmoid(gate))), so the
reduce is one scaled fold (acc, factor), one fma per element, with the sigmoid dswiglu computes anyway; as a
two-product value it kept one more fragment live, which spilled at 128x192 (sm_90a SASS: 382 local stores against
307) and ran 1.8-3.5% slower there (bench/results/h200-2026-12-02-i-notes.md). Launches: the GEMM and the
finalisation.
"""

from coda_agent.primitives import ColVecReduce, Config, dswiglu, epilogue, gemm, pack, schedule, sigmoid, unpack


@epilogue(outputs=("act",), reduces={"zdz": ColVecReduce(scaled=True)}, mode="packed")
def swiglu_bwd(acc, c):
    gate, up = unpack(c)
    dgate, dup, act = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "act": act, "zdz": (acc, act * (2.0 + gate * (1.0 - sigmoid(gate))))}


# 128x192 at the three K-4096 shapes, where its longer mainloop per tile outweighs its wider packed epilogue (1.8-3.7%
# faster than at the 128x128 packed default, bench/results/h200-2026-12-02-i-fold-probe.log); at K 2048 the default
# stays (128x192 ran 25-30% slower there).
# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H100 80GB HBM3; forward() as written -> tuned (GPU time;
# coda-agent tune: bench/results/h100-2026-12-06-c-tune-human-1.json):
# coda-agent tune:   llama3-8b: 1361.6 us, kept as written (nothing was 1% faster)
# coda-agent tune:   llama3-1b: 495.4 -> 489.9 us
# coda-agent tune:   coda-h2048: 704.6 -> 666.9 us
# coda-agent tune:   coda-h4096: 2108.0 us, kept as written (nothing was 1% faster)
# coda-agent tune:   ragged: 995.5 us, kept as written (nothing was 1% faster)
# coda-agent tune:   e2e-1b (32768 x 8192 x 2048, bench-e2e's Llama-3 1B stack, not a bench shape; pinned from the schedule probe, bench/results/h100-2026-12-06-d-notes.md): 2019.2 -> 1904.3 us
@schedule({
    ('swiglu_bwd', 8000, 10000, 4000): Config(),
    ('swiglu_bwd', 8192, 8192, 2048): Config(tile_n=128, cluster_m=1, cluster_n=2),
    ('swiglu_bwd', 8192, 14336, 4096): Config(),
    ('swiglu_bwd', 16384, 5632, 2048): Config(tile_n=128, cluster_m=1, cluster_n=2),
    ('swiglu_bwd', 16384, 11008, 4096): Config(),
    ('swiglu_bwd', 32768, 8192, 2048): Config(tile_n=128, cluster_m=1, cluster_n=2),
})
def forward(dy, w_down, preact):
    out = gemm(swiglu_bwd, dy, w_down, C=preact)
    return {"dpreact": out["D"], "act": out["act"], "zdz": out["zdz"]}
