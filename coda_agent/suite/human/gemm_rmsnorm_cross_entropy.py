"""LM-head GEMM + deferred RMSNorm row scale + cross-entropy statistics in one kernel (CODA k5).

The epilogue scales the FP32 accumulator by rstd (a column vector), stores the logits, folds a stable
online logsumexp over the vocabulary and gathers each row's exact target logit; the host subtracts. A
target equal to ignore_index selects no column, so its row of the select comes back NaN, which the host
turns into the ignored token's zero loss.
Launches: the GEMM, the lse finalisation, the select buffer fill, the subtraction and the NaN fill.
"""

import torch

from coda_agent.primitives import ColVecLoad, ColVecSelect, Config, OnlineLSEReduce, epilogue, gemm, schedule


@epilogue(
    operands={"rstd": ColVecLoad()},
    reduces={"lse": OnlineLSEReduce(), "tgt": ColVecSelect(index="targets")},
)
def rstd_lse_target(acc, rstd):
    logits = acc * rstd
    return {"D": logits, "lse": logits, "tgt": logits}


# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H100 80GB HBM3; forward() as written -> tuned (GPU time;
# coda-agent tune: bench/results/h100-2026-12-06-c-tune-human-2.json):
# coda-agent tune:   llama3-8b-lmhead: 5543.1 -> 5483.0 us
# coda-agent tune:   llama3-1b-lmhead: 2807.8 -> 2759.8 us
# coda-agent tune:   coda-h2048: 2882.1 -> 2839.8 us
# coda-agent tune:   coda-h4096: 5838.8 -> 5678.0 us
# coda-agent tune:   ragged: 1405.3 -> 1386.7 us
@schedule({
    ('rstd_lse_target', 4000, 32000, 4096): Config(tile_n=208),
    ('rstd_lse_target', 4096, 128256, 2048): Config(tile_n=208),
    ('rstd_lse_target', 4096, 128256, 4096): Config(tile_n=208),
    ('rstd_lse_target', 16384, 32768, 2048): Config(tile_n=208),
    ('rstd_lse_target', 16384, 32768, 4096): Config(tile_n=208),
})
def forward(x, w, rstd, targets, ignore_index):
    out = gemm(rstd_lse_target, x, w.t(), rstd=rstd, targets=targets)
    return {"logits": out["D"], "lse": out["lse"], "loss": torch.nan_to_num(out["lse"] - out["tgt"], nan=0.0)}
